"""`session.usage.updated` and the `usage` of `session.closed`: how long the session has run on its
timeline and how full its context is.

`context_window.usage_ratio` is the reasoner's own figure when the session has one (its context's
characters over the budget past which the oldest turns are folded into the running summary,
server/background_context.py): the number a client would act on, since that context is what fills.
The same report's detail rides along under `duplex`. A session without a reasoner has no context window
that can fill; its ratio is then the conversation log's characters over LOG_CHARS, at most 1, so that
the field is present (the clients read it) and still grows with what was said.
"""

from __future__ import annotations

from typing import Any

from server import protocol as p
from server.live.context import TICK_MS
from server.session_limits import reasoner_usage
from server.sessions import Session

USAGE_EVERY_TICKS = 75  # session.usage.updated every 15 s of the session's timeline
LOG_CHARS = 32_768  # a session without a reasoner: the log's characters that count as a full window


def seconds(ticks: int) -> float:
    """The session's timeline at micro-turn `ticks`, in seconds."""
    return round(ticks * TICK_MS / 1000, 1)


def usage_event(session: Session | None, ticks: int) -> dict[str, Any]:
    """`session.usage.updated` at micro-turn `ticks`."""
    reasoner = reasoner_usage(session) if session is not None else None
    if reasoner is not None:
        ratio = float(reasoner["usage_ratio"])
    else:
        held = sum(len(e.text) for e in session.log.entries) if session is not None else 0
        ratio = round(min(1.0, held / LOG_CHARS), 4)
    event: dict[str, Any] = {"type": "session.usage.updated", "event_id": p.new_id("event"),
                             "usage": {"seconds": seconds(ticks)}, "context_window": {"usage_ratio": ratio}}
    if reasoner is not None:
        event["duplex"] = {"reasoner_context": reasoner}
    return event
