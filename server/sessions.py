"""Session state held by the server and the registry that owns it (open / get / close / reap).

A session outlives its connection: when a client drops, the session is detached and paused (not
stepped, so its model state is exactly where the client left it) and can be resumed with its token
within a grace period. After that its model state is freed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from models.base import BackgroundChunk, SessionState, TickOutput
from server.conversation import ConversationLog
from streaming.chunker import Chunker

log = logging.getLogger(__name__)


class Pace(StrEnum):
    REALTIME = "realtime"  # ticks at absolute deadlines, whatever arrived
    MEDIA = "media"  # ticks as soon as a full micro-turn of input has arrived


class OutputSink(Protocol):
    """The transport side of a session: receives each micro-turn's output on the event loop."""

    def deliver(self, out: TickOutput, tick: int) -> None: ...

    def end(self, code: int, reason: str) -> None:
        """The server closes the session (idle, shutdown): tell the client why and hang up."""
        ...

    def emit(self, event: dict[str, Any]) -> None:
        """Send one protocol event (a JSON-able dict) to the client, e.g. background results."""
        ...


class BackgroundHook(Protocol):
    """What the engine needs from a session's background worker (server/background.py)."""

    def drain(self) -> list[BackgroundChunk]: ...

    def on_output(self, out: TickOutput, tick: int) -> None: ...

    async def stop(self) -> None: ...


class NoBackground:
    """Used when a server runs without a background reasoner (e.g. the echo diagnostics)."""

    def drain(self) -> list[BackgroundChunk]:
        return []

    def on_output(self, out: TickOutput, tick: int) -> None:
        return None

    async def stop(self) -> None:
        return None


@dataclass(eq=False)  # identity semantics: sessions live in sets
class Session:
    id: str
    resume_token: str
    state: SessionState  # the model's per-session state (KV slot, VAD state...), opaque here
    chunker: Chunker  # pending input audio, bounded
    pace: Pace = Pace.REALTIME
    instructions: str = ""  # system instructions for the background reasoner
    tools: list[dict[str, Any]] = field(default_factory=list)  # client-declared tools (Realtime format)
    config: dict[str, Any] = field(default_factory=dict)  # the rest of session.update, echoed back
    text_in: list[str] = field(default_factory=list)  # typed text waiting for the next tick
    video: npt.NDArray[np.uint8] | None = None  # newest frame since the last tick
    cancel: bool = False  # response.cancel waiting for the next tick
    tick: int = 0  # micro-turns stepped so far (the session's own timeline)
    audio_started: bool = False  # any audio received yet (pace is fixed after that)
    ticking: bool = False  # real-time: the clock runs for this session (from its first input on)
    log: ConversationLog = field(default_factory=ConversationLog)
    background: BackgroundHook = field(default_factory=NoBackground)
    sink: OutputSink | None = None  # None while detached
    detached_at: float | None = None  # monotonic time of the disconnect, None while attached
    last_activity: float = field(default_factory=time.monotonic)
    closed: bool = False
    # Outputs produced while detached (a step was in flight at the disconnect); replayed on resume.
    undelivered: deque[tuple[TickOutput, int]] = field(default_factory=lambda: deque(maxlen=50))
    # -- engine bookkeeping (server/engine.py), not for transports --
    slot: int = 0  # phase slot within the micro-turn (real-time pace)
    period_index: int = 0  # global micro-turn index of the next deadline
    ready_at: float = 0.0  # monotonic time the newest whole micro-turn of input completed
    catch_up: bool = False  # step once extra as soon as possible (a surplus persisted)
    surplus_streak: int = 0
    in_flight: int = 0  # steps submitted and not yet delivered
    last_lateness: float = 0.0  # seconds the last real-time step started after its deadline (duplex.tick)
    room: asyncio.Event = field(default_factory=asyncio.Event)  # media pace: input buffer has room

    @property
    def attached(self) -> bool:
        return self.sink is not None

    def emit(self, event: dict[str, Any]) -> None:
        """Send an event to the client if one is attached (dropped while detached)."""
        if self.sink is not None:
            self.sink.emit(event)

    def deliver(self, out: TickOutput, tick: int) -> None:
        if self.sink is not None:
            self.sink.deliver(out, tick)
        else:
            self.undelivered.append((out, tick))


class RegistryFull(Exception):
    """Raised by `open` when admitting one more session would break the step budget or KV memory."""


Opener = Callable[[str], Awaitable[SessionState]]
Closer = Callable[[Session], Awaitable[None]]


class SessionRegistry:
    def __init__(self, capacity: int, opener: Opener, closer: Closer, max_backlog_ticks: int = 10,
                 resume_grace: float = 30.0, idle_timeout: float = 0.0) -> None:
        self.capacity = capacity
        self._open_state = opener  # allocates model state on the inference thread
        self._close = closer  # engine removal + model close + background stop
        self.max_backlog_ticks = max_backlog_ticks
        self.resume_grace = resume_grace
        self.idle_timeout = idle_timeout  # 0 = never reap attached sessions for idleness
        self._by_id: dict[str, Session] = {}
        self._by_token: dict[str, Session] = {}
        self._opening = 0  # admitted but not yet registered (model.open in flight)

    def __len__(self) -> int:
        return len(self._by_id)

    def sessions(self) -> list[Session]:
        return list(self._by_id.values())

    async def open(self) -> Session:
        if len(self._by_id) + self._opening >= self.capacity:
            raise RegistryFull(f"server full: {len(self._by_id)} of {self.capacity} sessions in use; try again later")
        self._opening += 1
        try:
            sid = "sess_" + secrets.token_hex(8)
            state = await self._open_state(sid)
        finally:
            self._opening -= 1
        session = Session(id=sid, resume_token=secrets.token_urlsafe(24), state=state,
                          chunker=Chunker(max_backlog_ticks=self.max_backlog_ticks))
        session.room.set()
        self._by_id[sid] = session
        self._by_token[session.resume_token] = session
        return session

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def detach(self, session: Session, now: float | None = None) -> None:
        """The client went away: keep the session for `resume_grace` seconds, paused."""
        session.sink = None
        session.detached_at = time.monotonic() if now is None else now

    def resumable(self, token: str) -> Session | None:
        """The detached session a token names; None if unknown, expired or still attached."""
        session = self._by_token.get(token)
        if session is None or session.closed or session.attached:
            return None
        return session

    def resume(self, token: str, sink: OutputSink) -> Session | None:
        """Reattach a detached session by its token (see `resumable`); replays undelivered outputs."""
        session = self.resumable(token)
        if session is None:
            return None
        session.sink = sink
        session.detached_at = None
        session.last_activity = time.monotonic()
        while session.undelivered:
            sink.deliver(*session.undelivered.popleft())
        return session

    async def close(self, session: Session, code: int = 1000, reason: str = "") -> None:
        if session.closed:
            return
        session.closed = True
        if reason and session.sink is not None:
            session.sink.end(code, reason)
        self._by_id.pop(session.id, None)
        self._by_token.pop(session.resume_token, None)
        await self._close(session)

    async def reap(self, now: float) -> list[Session]:
        """Close sessions past their resume grace, and attached sessions idle past the idle timeout."""
        expired = [
            s for s in self._by_id.values()
            if (s.detached_at is not None and now - s.detached_at > self.resume_grace)
            or (self.idle_timeout > 0 and s.attached and now - s.last_activity > self.idle_timeout)
        ]
        for s in expired:
            log.info("reaping session %s (%s)", s.id, "resume grace over" if s.detached_at else "idle")
            await self.close(s, 1000, "" if s.detached_at else "session idle timeout")
        return expired
