"""A session's clock as the operator bounds it and the client sees it: the longest life a session may have
(`--max-session-minutes`), the warning before it ends, and the periodic usage report.

Checked from the runtime's upkeep loop (once a second), so a session ends within a second of its limit.
The limit counts from when the session opened on this replica, attached or detached alike: a client
cannot extend it by reconnecting.
"""

from __future__ import annotations

from typing import Any

from server import protocol as p
from server.sessions import Session
from streaming.types import TICK_SECONDS

TIME_LIMIT_CLOSE = 4000  # WebSocket close code (private range) of a session ended by --max-session-minutes
TIME_LIMIT_REASON = "session_time_limit"
USAGE_EVERY = 15.0  # seconds between duplex.session.usage events to one attached session


class SessionLimits:
    def __init__(self, max_minutes: float | None, warning_s: float, usage_every: float = USAGE_EVERY) -> None:
        self.max_s = max_minutes * 60 if max_minutes else None
        self.max_minutes = max_minutes
        self.warning_s = warning_s
        self.usage_every = usage_every

    def over(self, sessions: list[Session], now: float) -> list[Session]:
        """Warn the sessions within the warning time of their limit (once each); return those past it."""
        if self.max_s is None:
            return []
        out = []
        for s in sessions:
            left = self.max_s - (now - s.opened_at)
            if left <= 0:
                out.append(s)
            elif left <= self.warning_s and not s.expiry_told:
                s.expiry_told = True
                s.emit({"type": "duplex.session.expiring", "event_id": p.new_id("event"),
                        "seconds_left": round(left, 1), "max_session_minutes": self.max_minutes,
                        "close_code": TIME_LIMIT_CLOSE, "reason": TIME_LIMIT_REASON})
        return out

    def reason(self) -> str:
        return f"{TIME_LIMIT_REASON}: sessions on this server last at most {self.max_minutes:g} minutes"

    def report_usage(self, sessions: list[Session], now: float) -> None:
        """duplex.session.usage to each attached session every `usage_every` seconds (0: never)."""
        if not self.usage_every:
            return
        for s in sessions:
            if s.attached and now - s.usage_at >= self.usage_every:
                s.usage_at = now
                s.emit(usage_event(s, now, self.max_s))


def reasoner_usage(s: Session) -> dict[str, Any] | None:
    """The reasoner's report on its context (server/background_context.py); None: the session has no
    reasoner."""
    usage = getattr(getattr(s.background, "context", None), "usage", None)
    if not callable(usage):
        return None
    report: dict[str, Any] = usage()
    return report


def usage_event(s: Session, now: float, max_s: float | None) -> dict[str, Any]:
    """How long the session has run and how full the reasoner's context is (None: it has no reasoner)."""
    usage = reasoner_usage(s)
    return {"type": "duplex.session.usage", "event_id": p.new_id("event"), "seconds": round(now - s.opened_at, 1),
            "audio_seconds": round(s.tick * TICK_SECONDS, 1),
            "seconds_left": round(max_s - (now - s.opened_at), 1) if max_s is not None else None,
            "reasoner_context": usage}
