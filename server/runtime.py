"""Everything a running server holds, and the one owner of a session's life.

`Runtime.create` builds it whole (server/startup.py: model, engine, capacity, reasoner) and starts it;
there is no half-built state. Transports and protocols only parse messages and move bytes: they ask
the runtime to `attach` a sink (a new session, or one resumed here or restored from the session
store), hand it the client's input through its verbs (server/verbs.py), and report how their
connection ended (`detach` with an `Ended`); the runtime decides what becomes of the session and its
resume token, and it (or its upkeep loop, or a drain) `close`s sessions. The registry, the engine and
a session's inbox are called from the runtime and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from models.base import InteractionModel
from server import protocol as p
from server._continuity import Restored, reissue
from server.agent import AgentServer
from server.auth import ResumeTokens, TokenCheck, default_origins, session_id_prefix
from server.claims import Claims
from server.config import ServerConfig
from server.drain import Drain
from server.session_limits import TIME_LIMIT_CLOSE, SessionLimits
from server.sessions import (
    RETRY_AFTER_FULL,
    Ended,
    Load,
    OutputSink,
    Refused,
    Session,
    SessionRegistry,
    check_pace,
)
from server.startup import Parts, build
from server.store import SessionStore
from server.upkeep import LEASE_S, upkeep_forever
from server.verbs import Verbs

log = logging.getLogger(__name__)

# The close code for a connection whose session a resume took over (4000-4999: the application's own;
# 4409 after HTTP's 409 Conflict). Not 1000 or 1001: a client must not read it as a goodbye or a drain.
TAKEN_OVER_CODE = 4409

__all__ = ["Ended", "Refused", "Runtime"]


class Runtime(Verbs):
    """Use `await Runtime.create(config)`; `__init__` only stores parts that are already built."""

    def __init__(self, config: ServerConfig, parts: Parts) -> None:
        self.config = config
        self.metrics = metrics = parts.metrics
        self.model = parts.model
        self.engine = engine = parts.engine
        self.reasoner = parts.reasoner  # shared by every session's background worker; closed at stop
        self.background_factory = parts.background_factory
        self.tokens = ResumeTokens(config.replica_id, config.cluster_secret)
        self.registry = SessionRegistry(parts.capacity, engine.open_state, config.max_backlog_ticks,
                                        config.resume_grace, config.idle_timeout, self.tokens.mint,
                                        session_id_prefix(config.replica_id))
        # Read when scraped: sessions being opened count as well as those held, as admission counts them.
        metrics.sessions_live.set_function(lambda: self.registry.in_use)
        self._drain = Drain()
        self.claims: Claims | None = None  # --session-store: sessions can continue on another replica
        self.allowed_origins = default_origins(config.host, config.port) | set(config.allowed_origins)
        self.started_at = time.time()
        self._reaper: asyncio.Task[None] | None = None
        self._transports: list[Callable[[], Awaitable[None]]] = []  # each closes its connections at stop
        self.agent = AgentServer(config.host, config.agent_port, self.load) if config.agent_port else None
        self.limits = SessionLimits(config.max_session_minutes, config.session_expiry_warning_s,
                                    config.session_usage_every)

    @classmethod
    async def create(cls, config: ServerConfig, model: InteractionModel | None = None) -> Runtime:
        """Build the parts (server/startup.py: model, engine, capacity, reasoner), then start the loops."""
        cfg = config
        runtime = cls(cfg, await build(cfg, model))
        metrics, engine = runtime.metrics, runtime.engine
        if cfg.session_store:
            store = SessionStore.from_url(cfg.session_store, cfg.replica_id, cfg.resume_grace, LEASE_S,
                                          cfg.cluster_secret)
            runtime.claims = Claims(store, runtime.model)
            metrics.store_errors.set_function(lambda: store.errors)
        await engine.start()
        if runtime.agent is not None:
            await runtime.agent.start()
        runtime._reaper = asyncio.create_task(upkeep_forever(
            metrics, cfg.collect_every, runtime.reap, runtime.sync_store if runtime.claims is not None else None),
            name="duplex-reaper")
        return runtime

    # -- a session's life ---------------------------------------------------------------------------

    async def attach(self, sink: OutputSink, resume_token: str | None = None, client: str = "",
                     media: bool = True) -> Session:
        """Open a session for `sink`, or resume the detached one `resume_token` names (here, or from the
        session store when another replica issued it); raises Refused.

        On resume the token is rotated (the old one stops working; the new one is in the greeting),
        the session keeps its settings, and what it produced while detached is replayed in order.
        `media=False`: the transport cannot serve pace 'media' (WebRTC).
        """
        refused = self._drain.refusal(resume_token, moving=self.claims is not None)
        if refused is not None:
            raise refused
        if not resume_token:
            return await self._seat(await self._open(client), sink)
        if self._check_token(resume_token) is TokenCheck.FOREIGN:
            return await self._restore(sink, resume_token, client, media)
        session = self.registry.resumable(resume_token)
        if session is None:
            raise Refused("invalid_resume_token", "resume token is unknown, expired or already in use; "
                          "open a new session", 404, 1008)
        check_pace(session.settings.pace, media)
        # No await from resumable() to here: nobody else can take the session in between.
        self.registry.retoken(session)
        if session.sink is not None:
            self._take_over(session)
        return await self._seat(session, sink, resume_token)

    def _take_over(self, session: Session) -> None:
        """A resume with the session's current token while its old connection is still attached: the
        client came back before the server saw that connection end (a network that drops without a FIN or
        RST is seen only at the next keepalive, seconds later; a fast reconnect races the close). The token
        proves the client got that connection's greeting, so the new connection takes the session and the
        old one is hung up on; waiting for it to time out would refuse a client that did everything right."""
        old = session.sink
        assert old is not None
        self.registry.detach(session)  # the old connection's own detach is a no-op from here
        self.metrics.sessions_taken_over.inc()
        try:
            old.end(TAKEN_OVER_CODE, "session resumed on another connection")
        except Exception:  # a broken transport must not keep the client from its session
            log.exception("session %s: hanging up on the connection it left failed", session.id)

    async def _restore(self, sink: OutputSink, token: str, client: str, media: bool) -> Session:
        """A resume whose token another replica issued: the session store's story (server/claims.py)."""
        assert self.claims is not None
        started = time.monotonic()
        session, restored, failed = await self.claims.take_over(
            token, media, lambda sid: self.registry.open(client, session_id=sid, reserve=self.config.restore_reserve),
            self.engine, self.config.resume_grace)  # its replica died: it may take a place of the reserve
        await self._seat(session, sink, token, restored, failed)
        self.metrics.sessions_restored.inc()
        self.metrics.restore_seconds.observe(time.monotonic() - started)
        return session

    async def _open(self, client: str) -> Session:
        """A new session in the registry, within the per-client cap and the capacity."""
        cap = self.config.max_sessions_per_client
        if cap and client and self.registry.count(client) >= cap:
            raise Refused("too_many_sessions", f"this client already holds {cap} sessions (the limit per client); "
                          "close one (or let it expire) before opening another", 429, 1013,
                          {"Retry-After": str(RETRY_AFTER_FULL)})
        try:
            session = await self.registry.open(client)
        except Refused:
            self.metrics.sessions_refused.inc()
            raise
        if self.draining:  # the drain began while the model state was being opened
            await self.close(session)
            raise Refused("server_shutting_down", "server is shutting down; reconnect later", 503, 1013)
        return session

    async def _seat(self, session: Session, sink: OutputSink, came_with: str | None = None,
                    restored: Restored | None = None, failed: str | None = None) -> Session:
        """The one way a session takes its seat at a connection: new (`came_with` None), resumed here (the
        token it came back with), or restored from the store (`restored`; `failed`: why its model's
        state starts afresh). The client is greeted, then given what it missed, in order."""
        here = came_with is not None and restored is None  # resumed on this replica: its worker lives on
        if not here:
            session.background = self.background_factory(session)
        if came_with is None and self.claims is not None:
            self.claims.keep_log(session)  # before its first step
        self.registry.reattach(session, sink)
        session.came_with = came_with
        sink.bind(session, resumed=came_with is not None)
        if failed:
            sink.emit(p.error_event("model_state_lost", f"the model's memory of this conversation could not be "
                                    f"rebuilt on this server ({failed}); it starts afresh", kind="server_error"))
        lost = session.backlog.replay(sink)
        if restored is not None:
            reissue(session, restored)  # background requests that were in flight are asked again here
        if lost:
            self.metrics.dropped_events.labels("backlog_full").inc(lost)
            why = ("did not fit the resume backlog and were dropped; resume sooner to get them all" if here else
                   "were not carried to this server and are lost")
            sink.emit(p.error_event("backlog_overflow", f"{lost} outputs/events produced while you were "
                                    f"disconnected {why}", kind="server_error"))
        if here:
            self.engine.resumed(session)
        else:
            self.engine.add(session)
        if self.claims is not None and came_with is None:
            await self.claims.own(session)
        elif self.claims is not None and here:
            await self.claims.bind_token(session, previous=came_with)
        return session

    def _check_token(self, token: str) -> TokenCheck:
        """Refuse a token no replica made (403), or one made by another replica (421: the proxy should
        have sent it there) unless the session store may hold its session, before looking it up."""
        verdict = self.tokens.check(token)
        if verdict is TokenCheck.FORGED:
            raise Refused("invalid_resume_token", "resume token is not valid (its signature does not verify); "
                          "open a new session", 403, 1008)
        if verdict is TokenCheck.FOREIGN and self.claims is None:
            raise Refused("invalid_resume_token", "resume token belongs to another replica, which this one "
                          "cannot resume; open a new session", 421, 1008)
        return verdict

    async def detach(self, session: Session, sink: OutputSink, ended: Ended) -> None:
        """`sink`'s connection to `session` ended as `ended` says; a no-op when `sink` no longer owns the
        session (it was resumed elsewhere, or closed). A goodbye closes the session now; otherwise it is
        kept for the resume grace period, and the token its connection came with keeps working when the
        client may not have the rotated one (a session whose client never got its first token is closed)."""
        if session.closed or session.sink is not sink:
            return
        came_with = session.came_with
        if ended is Ended.GOODBYE or (ended is Ended.NEVER_CONNECTED and came_with is None):
            await self.close(session)
            return
        restore_token = came_with if ended is Ended.NEVER_CONNECTED else None  # the client has only that one
        keep_token = came_with if ended is Ended.UNCONFIRMED else None  # it may have either
        if self.draining and self.claims is not None and self.claims.holds(session):
            # Draining with a store: the client will reconnect elsewhere; hand the session on now.
            for token in (restore_token, keep_token):
                await self.claims.alias(session, token or "")
            await self.claims.hand_off(session)
            await self.close(session)
            return
        self.registry.detach(session)
        if restore_token:
            self.registry.retoken(session, restore_token)
        elif keep_token:
            self.registry.keep_token(session, keep_token)
        if self.claims is not None:
            # The client may hold only that token: it must name the session on another replica too.
            await self.claims.alias(session, restore_token or keep_token or "")

    async def close(self, session: Session, reason: str = "", code: int = 1000) -> None:
        """End a session for good: tell its client why (when `reason`); stop its background worker, drop
        it from the engine, close its model state and forget it in the session store."""
        if session.closed:
            return
        sink = self.registry.unregister(session)  # its place and tokens are free whatever happens below
        try:
            if reason and sink is not None:
                sink.end(code, reason)
        except Exception:  # a broken transport must not keep the model state alive
            log.exception("session %s: telling the client why it closes failed", session.id)
        try:
            try:
                await session.background.stop()
            finally:
                await self.engine.close_state(session)
                if self.claims is not None:
                    await self.claims.release(session)
        finally:
            # A closed Session can stay reachable for a while (reference cycles through its connection
            # and background worker); the model state it held (KV slot, resamplers with their threads,
            # recogniser) must not wait for the garbage collector with it.
            session.state = None

    async def sync_store(self) -> None:
        """Renew this replica's leases and write changed snapshots (from the upkeep loop). A session
        another replica took over is closed here: it is served there now."""
        if self.claims is None:
            return
        for session in await self.claims.sync(self.registry.sessions()):
            await self.close(session, "session moved to another server", 1001)

    def session(self, session_id: str) -> Session | None:
        """The session (attached or awaiting resume) with this id, whatever its transport."""
        return self.registry.get(session_id)

    # -- server life --------------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """Going away: no new session (server/drain.py)."""
        return self._drain.active

    @property
    def drained(self) -> asyncio.Event:
        """Set once a drain closes sessions: transports stop waiting on slow clients."""
        return self._drain.done

    @property
    def capacity(self) -> int:
        return self.registry.capacity

    @property
    def in_use(self) -> int:
        """Sessions held (attached or awaiting resume) and being opened: what admission counts."""
        return self.registry.in_use

    def load(self) -> Load:
        """The figures `/healthz` and the proxy's agent check report."""
        attached = sum(1 for s in self.registry.sessions() if s.attached)
        return Load(sessions=self.registry.in_use, capacity=self.registry.capacity, attached=attached,
                    draining=self.draining, problem=self.health(), moving=self.draining and self.claims is not None,
                    reserve=self.config.restore_reserve if self.claims is not None else 0)

    def health(self) -> str | None:
        """None when healthy; otherwise why not (the engine loop died, a step hangs)."""
        return self.engine.health()

    def add_transport(self, close_all: Callable[[], Awaitable[None]]) -> None:
        """A transport with connections of its own to end at shutdown (WebRTC peers): `stop` awaits
        `close_all` after the drain has told every session why."""
        self._transports.append(close_all)

    async def reap(self, now: float) -> list[Session]:
        """Close sessions past their resume grace, attached sessions idle past the idle timeout and sessions
        past --max-session-minutes (warned first); report usage to the attached ones."""
        expired = self.registry.expired(now)
        for s in expired:
            log.info("reaping session %s (%s)", s.id, "resume grace over" if s.detached_at else "idle")
            await self.close(s, "" if s.detached_at else "session idle timeout")
        for s in self.limits.over(self.registry.sessions(), now):
            log.info("closing session %s: its time limit passed", s.id)
            await self.close(s, self.limits.reason(), TIME_LIMIT_CLOSE)
            expired.append(s)
        self.limits.report_usage(self.registry.sessions(), now)
        return expired

    async def drain(self, reason: str) -> None:
        """Stop admitting, tell every live session why, and close them all. Runs first on SIGTERM or
        SIGINT (server/process.py), before the listening sockets close, and again (a no-op) in `stop`.

        With `--drain-grace S` (a replica behind a proxy) it first stops taking new sessions (the agent
        check says `drain`, /healthz 503), tells every session's client (`duplex.session.draining`, with
        its resume token and the seconds left) and lets the sessions go on for up to S seconds or until
        their clients have closed them; then it closes what is left, as without a grace."""
        first = not self.draining
        self._drain.active = True
        if first and self.config.drain_grace > 0 and len(self.registry):
            log.info("draining: %d sessions have %.0f s to finish", len(self.registry), self.config.drain_grace)
            await self._drain.grace(self.registry.sessions, reason, self.config.drain_grace, self.claims is not None,
                                    self.metrics)
        self._drain.done.set()
        for session in self.registry.sessions():
            if self.claims is not None:
                await self.claims.hand_off(session)  # with a store: what is left can still continue elsewhere
        for session in self.registry.sessions():
            try:
                await self.close(session, reason, 1001)
            except Exception:  # one broken session must not keep the others open
                log.exception("closing session %s during drain failed", session.id)

    async def stop(self) -> None:
        """Drain, end the transports' connections, stop the reaper and the engine, close the reasoner
        and the model."""
        await self.drain("server shutting down")
        for close_all in self._transports:
            try:
                await close_all()
            except Exception:
                log.exception("closing a transport's connections failed")
        if self.agent is not None:
            await self.agent.stop()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self.engine.stop(self.engine.features.shutdown)
        if self.reasoner is not None:
            try:
                await self.reasoner.aclose()
            except Exception:
                log.exception("closing the background reasoner failed")
        if self.claims is not None:
            await self.claims.store.aclose()

