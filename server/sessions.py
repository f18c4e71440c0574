"""Session state held by the server and the registry that holds it (open / get / unregister / expired).

A session outlives its connection: when a client drops, the session is detached and paused (not
stepped, so its model state is exactly where the client left it) and can be resumed with its token
within a grace period. After that its model state is freed. `server/runtime.py` sequences these
calls (attach / detach / close / reap); transports never call the registry themselves.

A `Session` is three parts with different owners:
  - `settings`: what the client chose (formats, instructions, tools, stats); survives a resume;
  - `inbox`: client input waiting for the next micro-turn (server/inbox.py), bounded;
  - `sched`: the engine's scheduling state (server/schedule.py), private to it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Protocol

from models.base import BackgroundChunk, SessionState, TickOutput
from server.backlog import Backlog
from server.conversation import ConversationLog
from server.inbox import Inbox
from server.items import ConversationItems
from server.protocol import AudioFormat
from server.schedule import Schedule

RETRY_AFTER_FULL = 5  # seconds a client refused for want of room is told to wait before trying again


class Refused(Exception):
    """A client cannot have a session (server full, draining, unknown token...). Raised by the runtime
    and the registry; each transport turns it into its own refusal (HTTP status or WebSocket close)."""

    def __init__(self, code: str, message: str, http_status: int, ws_close: int = 1008,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.http_status, self.ws_close = code, message, http_status, ws_close
        self.headers = headers


class Pace(StrEnum):
    REALTIME = "realtime"  # ticks at absolute deadlines, whatever arrived
    MEDIA = "media"  # ticks as soon as a full micro-turn of input has arrived


def check_pace(pace: Pace, media: bool) -> None:
    """Refuse to resume a media-pace session on a transport that cannot serve it (`media` False: WebRTC)."""
    if pace is Pace.MEDIA and not media:
        raise Refused("pace_unsupported", "this session runs in pace 'media', which only the WebSocket "
                      "endpoint serves; resume it there", 409, 1008)


class Ended(Enum):
    """How a transport's connection to its session ended, as the transport saw it. The runtime decides
    what becomes of the session and of its resume tokens (Runtime.detach)."""

    GOODBYE = "goodbye"  # the client closed cleanly: it is done with the session
    DROPPED = "dropped"  # lost after the client showed it had the greeting (and with it the new token)
    UNCONFIRMED = "unconfirmed"  # lost before the client showed that: it may hold only the token it came with
    NEVER_CONNECTED = "never_connected"  # the greeting never reached the client


class OutputSink(Protocol):
    """The transport side of a session: receives each micro-turn's output on the event loop."""

    def bind(self, session: Session, resumed: bool) -> None:
        """The runtime attached `session` to this sink: greet the client (session.created...)."""
        ...

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

    def media_wait(self, tick: int) -> float:
        """Seconds a media-pace `tick` must still wait for the background to reach its virtual time."""
        ...

    async def stop(self) -> None: ...

    def on_client_event(self, ev: dict[str, Any]) -> bool:
        """A client event for the reasoner (duplex.background.request, a function_call_output item);
        False when there is no reasoner to take it."""
        ...


class NoBackground:
    """Used when a server runs without a background reasoner (e.g. the echo diagnostics)."""

    def drain(self) -> list[BackgroundChunk]:
        return []

    def on_output(self, out: TickOutput, tick: int) -> None:
        return None

    def media_wait(self, tick: int) -> float:
        return 0.0

    async def stop(self) -> None:
        return None

    def on_client_event(self, ev: dict[str, Any]) -> bool:
        return False


@dataclass
class SessionSettings:
    """What the client chose with session.update. Belongs to the session, so it survives a resume."""

    pace: Pace = Pace.REALTIME
    in_format: AudioFormat = field(default_factory=AudioFormat)  # client audio in (resampled to 24 kHz)
    out_format: AudioFormat = field(default_factory=AudioFormat)  # audio the client gets back
    instructions: str = ""  # system instructions for the background reasoner
    tools: list[dict[str, Any]] = field(default_factory=list)  # client-declared tools (Realtime format)
    # Whether the reasoner must, may or must not call them: "auto", "none", "required" or
    # {"type": "function", "name": ...} (Realtime format; server/client_tools.py says what each does).
    tool_choice: str | dict[str, Any] = "auto"
    output_modality: str = "audio"  # "text": responses carry output_text parts and no audio
    tick_stats: bool = False  # send duplex.tick after every micro-turn
    # Media pace: where this session's micro-turn 0 lies on a clock shared with other media sessions
    # that a client steps in lockstep (bench/fdbench/lockstep.py). The shared background reasoner then
    # times their requests against each other as real time would (models/background/clock.py).
    media_clock: int | None = None


@dataclass(frozen=True)
class RequestConfig:
    """The reasoner's side of one response (`response.create`'s, checked in server/response_config.py):
    each None keeps the session's."""

    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def instructions_for(self, settings: SessionSettings) -> str:
        return settings.instructions if self.instructions is None else self.instructions

    def tools_for(self, settings: SessionSettings) -> list[dict[str, Any]]:
        return settings.tools if self.tools is None else self.tools

    def tool_choice_for(self, settings: SessionSettings) -> str | dict[str, Any]:
        return settings.tool_choice if self.tool_choice is None else self.tool_choice


@dataclass(frozen=True)
class OutputConfig:
    """The output's side of one response: its modality (None: the session's) and metadata to echo."""

    modality: str | None = None
    metadata: dict[str, str] | None = None

    def modality_for(self, settings: SessionSettings) -> str:
        return settings.output_modality if self.modality is None else self.modality


@dataclass(frozen=True)
class Load:
    """A replica's figures, as `/healthz` and the proxy's agent check report them (Runtime.load)."""

    sessions: int  # held (attached or awaiting resume) and being opened: what admission counts
    capacity: int  # sessions admitted at once
    attached: int  # sessions with a live connection
    draining: bool  # shutting down: no new session, no resume
    problem: str | None  # why the replica is unhealthy; None when healthy
    moving: bool = False  # draining with a session store: its sessions continue on other replicas
    reserve: int = 0  # places above capacity that only sessions restored from the store may take

    @property
    def restore_room(self) -> int:
        """Places for a session restored from another replica (its own place plus the reserve)."""
        return max(0, self.capacity + self.reserve - self.sessions)

    @property
    def free(self) -> int:
        """Places for new sessions (a detached session keeps its place for its resume)."""
        return max(0, self.capacity - self.sessions)


@dataclass(eq=False)  # identity semantics: sessions live in sets
class Session:
    id: str
    resume_token: str
    state: SessionState  # the model's per-session state (KV slot, VAD state...), opaque here
    settings: SessionSettings = field(default_factory=SessionSettings)
    inbox: Inbox = field(default_factory=Inbox)
    sched: Schedule = field(default_factory=Schedule)  # engine-private
    client: str = ""  # who opened it (API key or address), for the per-client session cap
    tick: int = 0  # micro-turns stepped so far (the session's own timeline)
    last_lateness: float = 0.0  # seconds the last real-time step started after its deadline (duplex.tick)
    heard_through: int = 0  # input samples the last delivered micro-turn had heard, in all (duplex.tick)
    log: ConversationLog = field(default_factory=ConversationLog)
    items: ConversationItems = field(default_factory=ConversationItems)  # as the client saw them (item.retrieve)
    background: BackgroundHook = field(default_factory=NoBackground)
    sink: OutputSink | None = None  # None while detached
    detached_at: float | None = None  # monotonic time of the disconnect, None while attached
    last_activity: float = field(default_factory=time.monotonic)
    closed: bool = False
    backlog: Backlog = field(default_factory=Backlog)  # produced while detached; replayed on resume
    spare_token: str | None = None  # the token it last resumed with, while the client may lack the new one
    came_with: str | None = None  # the token its current connection resumed (or restored) it with; None if new
    opened_at: float = field(default_factory=time.monotonic)  # when it opened here (--max-session-minutes)
    expiry_told: bool = False  # duplex.session.expiring was sent
    usage_at: float = field(default_factory=time.monotonic)  # when duplex.session.usage was last sent
    # What the last response.create asked of the next background request and of the next response
    # announced (server/response_config.py): each taken once, by the first that starts.
    next_request: RequestConfig | None = None
    next_output: OutputConfig | None = None

    @property
    def attached(self) -> bool:
        return self.sink is not None

    @property
    def audio_started(self) -> bool:
        """Any audio received yet (pace and input format are fixed after that)."""
        return self.inbox.audio_started

    @property
    def buffered_samples(self) -> int:
        """Input samples waiting for the coming micro-turns."""
        return self.inbox.buffered

    @property
    def dropped_samples(self) -> int:
        """Input samples dropped because the client ran ahead of real time, in all."""
        return self.inbox.dropped

    def emit(self, event: dict[str, Any]) -> None:
        """Send an event to the client; while detached it waits in the backlog for the resume."""
        if self.sink is not None:
            self.sink.emit(event)
        elif not self.closed:
            self.backlog.add_event(event)

    def deliver(self, out: TickOutput, tick: int) -> None:
        if self.sink is not None:
            self.sink.deliver(out, tick)
        elif not self.closed:
            self.backlog.add_output(out, tick)


Opener = Callable[[str], Awaitable[SessionState]]


class SessionRegistry:
    def __init__(self, capacity: int, opener: Opener, max_backlog_ticks: int = 10,
                 resume_grace: float = 30.0, idle_timeout: float = 0.0,
                 mint_token: Callable[[], str] | None = None, id_prefix: str = "sess_") -> None:
        self.capacity = capacity
        # Makes resume tokens: the runtime's names this replica and carries a MAC (server/auth.py).
        self._mint = mint_token or (lambda: secrets.token_urlsafe(24))
        self._id_prefix = id_prefix  # the runtime's names this replica, so a proxy can route by session id
        self._open_state = opener  # allocates model state on the inference thread
        self.max_backlog_ticks = max_backlog_ticks
        self.resume_grace = resume_grace
        self.idle_timeout = idle_timeout  # 0 = never reap attached sessions for idleness
        self._by_id: dict[str, Session] = {}
        self._by_token: dict[str, Session] = {}
        self._opening = 0  # admitted but not yet registered (model.open in flight)

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def in_use(self) -> int:
        """Sessions held (attached or awaiting resume) and sessions being opened: what admission counts."""
        return len(self._by_id) + self._opening

    def sessions(self) -> list[Session]:
        return list(self._by_id.values())

    def count(self, client: str) -> int:
        """Sessions (attached or awaiting resume) opened by `client`."""
        return sum(1 for s in self._by_id.values() if s.client == client)

    async def open(self, client: str = "", session_id: str | None = None, reserve: int = 0) -> Session:
        """Admit and open a session (`session_id`: one restored from the session store keeps its id;
        `reserve`: places above capacity it may take); raises Refused("server_full") when every place is
        held or being opened."""
        if self.in_use >= self.capacity + reserve:
            raise Refused("server_full", f"server full: {self.in_use} of {self.capacity} sessions in use; try again "
                          "later", 503, 1013, {"Retry-After": str(RETRY_AFTER_FULL)})
        self._opening += 1
        try:
            sid = session_id or self._id_prefix + secrets.token_hex(8)
            state = await self._open_state(sid)
        finally:
            self._opening -= 1
        session = Session(id=sid, resume_token=self._mint(), state=state,
                          inbox=Inbox(self.max_backlog_ticks), client=client)
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
        """The session a token names, detached or still attached (a client back before its old connection
        was seen to end takes the session over); None if unknown or expired."""
        session = self._by_token.get(token)
        if session is None or session.closed:
            return None
        return session

    def retoken(self, session: Session, token: str | None = None) -> str:
        """Give `session` a new resume token (a fresh one unless `token`); the old ones stop working."""
        self._by_token.pop(session.resume_token, None)
        if session.spare_token is not None:
            self._by_token.pop(session.spare_token, None)
            session.spare_token = None
        session.resume_token = token or self._mint()
        self._by_token[session.resume_token] = session
        return session.resume_token

    def keep_token(self, session: Session, token: str) -> None:
        """`token` (the one the session last resumed with) works again, next to the current one, until
        either is used: for a connection that ended before the client showed it got the new one."""
        session.spare_token = token
        self._by_token[token] = session

    def reattach(self, session: Session, sink: OutputSink) -> None:
        session.sink = sink
        session.detached_at = None
        session.last_activity = time.monotonic()

    def unregister(self, session: Session) -> OutputSink | None:
        """Forget a session for good (its place and tokens are free at once) and return the sink it was
        attached to; the runtime frees what it holds."""
        session.closed = True
        self._by_id.pop(session.id, None)
        self._by_token.pop(session.resume_token, None)
        if session.spare_token is not None:
            self._by_token.pop(session.spare_token, None)
        sink, session.sink = session.sink, None
        return sink

    def expired(self, now: float) -> list[Session]:
        """Sessions past their resume grace, and attached sessions idle past the idle timeout (the
        runtime's reaper closes them)."""
        return [
            s for s in self._by_id.values()
            if (s.detached_at is not None and now - s.detached_at > self.resume_grace)
            or (self.idle_timeout > 0 and s.attached and now - s.last_activity > self.idle_timeout)
        ]
