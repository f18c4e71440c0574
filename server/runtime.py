"""Everything a running server holds, and the one owner of a session's life.

`Runtime.create` builds it whole (model, engine, registry, background reasoner) and starts it; there
is no half-built state. Transports (WebSocket, WebRTC) only parse messages and move bytes: they ask
the runtime to `attach` a sink (new session or resume), hand it the client's input (`push_audio`,
`push_text`, `cancel`, `settings_changed`...), and `detach` when their connection ends; the runtime
(or its reaper, or a drain) `close`s sessions. The registry, the engine and a session's inbox are
called here and nowhere else; so are reaping, draining and shutting down.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt

from models import heap
from models.background import Reasoner
from models.base import InteractionModel, Preloading
from models.registry import load_model
from server import protocol as p
from server._continuity import continue_work, parse, restore
from server.admission import HARD_CAP, admitted, budget, calibrate
from server.agent import AgentServer
from server.auth import ResumeTokens, TokenCheck, default_origins, session_id_prefix
from server.background import make_background_factory
from server.claims import Claims
from server.config import ServerConfig
from server.engine import Engine
from server.metrics import Metrics
from server.sessions import (
    RETRY_AFTER_FULL,
    BackgroundHook,
    Load,
    OutputSink,
    Pace,
    Refused,
    Session,
    SessionRegistry,
    SessionSettings,
)
from server.store import SessionStore
from streaming.types import Audio

log = logging.getLogger(__name__)

__all__ = ["Refused", "Runtime"]

BackgroundFactory = Callable[[Session], BackgroundHook]
REAP_EVERY = 1.0  # seconds between reaps of idle and expired sessions
LAG_PROBE = 0.1  # seconds between event-loop lag probes (duplex_event_loop_lag_seconds)
OVERRUN_ERROR_INTERVAL = 1.0  # seconds between repeated input_overrun errors to one session
DRAIN_POLL = 0.1  # seconds between looks at the sessions left during a drain's grace
# The session store: a lease lasts LEASE_S and is renewed every STORE_SYNC, when changed snapshots are
# written too. A replica killed with -9 stops renewing; its sessions can be claimed LEASE_S later.
LEASE_S = 1.5
STORE_SYNC = 0.4


def _report_preload(done: Future[None]) -> None:
    """Runs on the reasoner's thread: a reasoner that failed to start is an error in the log now, not
    only in the first answer (which gets an error chunk, as every answer does until it starts)."""
    if not done.cancelled() and (exc := done.exception()) is not None:
        log.error("background reasoner did not start: %s; answers get an error until it does", exc)


class Runtime:
    """Use `await Runtime.create(config)`; `__init__` only stores parts that are already built."""

    def __init__(self, config: ServerConfig, metrics: Metrics, model: InteractionModel, engine: Engine,
                 capacity: int, reasoner: Reasoner | None, background_factory: BackgroundFactory) -> None:
        self.config = config
        self.metrics = metrics
        self.model = model
        self.engine = engine
        self.reasoner = reasoner  # shared by every session's background worker; closed at stop
        self.background_factory = background_factory
        self.tokens = ResumeTokens(config.replica_id, config.cluster_secret)
        self.registry = SessionRegistry(capacity, engine.open_state, self._free, config.max_backlog_ticks,
                                        config.resume_grace, config.idle_timeout, self.tokens.mint,
                                        session_id_prefix(config.replica_id))
        # Read when scraped: sessions being opened count as well as those held, as admission counts them.
        metrics.sessions_live.set_function(lambda: self.registry.in_use)
        self.draining = False
        self.drained = asyncio.Event()  # set once drain() closes sessions: transports stop waiting on slow clients
        self._grace_until: float | None = None  # monotonic end of a drain's grace, while it runs
        self.claims: Claims | None = None  # --session-store: sessions can continue on another replica
        self.allowed_origins = default_origins(config.host, config.port) | set(config.allowed_origins)
        self.started_at = time.time()
        self._reaper: asyncio.Task[None] | None = None
        self._transports: list[Callable[[], Awaitable[None]]] = []  # each closes its connections at stop
        self.agent = AgentServer(config.host, config.agent_port, self.load) if config.agent_port else None

    @classmethod
    async def create(cls, config: ServerConfig, model: InteractionModel | None = None) -> Runtime:
        """Load the model on a worker thread, measure capacity, build the reasoner, start the loops."""
        cfg = config
        if model is None:
            log.info("loading model %s ...", cfg.model)
            # Loading imports torch and reads weights: keep it off the event loop.
            model = await asyncio.get_running_loop().run_in_executor(
                None, lambda: load_model(cfg.model, cfg.checkpoint, cfg.device, cfg.native))
        metrics = Metrics()
        engine = Engine(model, metrics, phase_groups=cfg.phase_groups or 1, guard=cfg.guard_ms / 1000,
                        late_input=cfg.late_input_ms / 1000, hang_after=cfg.step_watchdog_s)
        groups, capacity = cfg.phase_groups, cfg.max_sessions
        if groups is None or capacity is None:
            cal = await calibrate(engine)
            groups = groups or cal.groups(budget(engine))
            capacity = capacity or cal.capacity(budget(engine), groups, model.max_sessions or HARD_CAP)
        engine.set_phase_groups(groups)
        reasoner, factory = make_background_factory(cfg, metrics)
        capacity, why = admitted(capacity, cfg.max_sessions, model.max_sessions, model.name, reasoner,
                                 engine.features.delegates)
        log.info("model %s ready; admitting up to %d sessions (%s); %d phase groups (%.1f ms apart)",
                 model.name, capacity, why, groups, engine.grid * 1000)
        if isinstance(reasoner, Preloading) and engine.features.delegates:
            # On the reasoner's own thread, now: the first answer does not wait for the weights to load
            # and their cost to be measured (~1.3 s, token_clock.py). A failure is raised again by that
            # request. A model that never delegates (`delegates = False`: echo) never pays for it.
            reasoner.preload().add_done_callback(_report_preload)
        runtime = cls(cfg, metrics, model, engine, capacity, reasoner, factory)
        if cfg.session_store:
            store = SessionStore.from_url(cfg.session_store, cfg.replica_id, cfg.resume_grace, LEASE_S)
            runtime.claims = Claims(store, model)
            metrics.store_errors.set_function(lambda: store.errors)
        await engine.start()
        if runtime.agent is not None:
            await runtime.agent.start()
        runtime._reaper = asyncio.create_task(runtime._reap_forever(), name="duplex-reaper")
        return runtime

    # -- a session's life ---------------------------------------------------------------------------

    async def attach(self, sink: OutputSink, resume_token: str | None = None, client: str = "",
                     media: bool = True) -> Session:
        """Open a session for `sink`, or resume the detached one `resume_token` names; raises Refused.

        On resume the token is rotated (the old one stops working; the new one is in the greeting),
        the session keeps its settings, and what it produced while detached is replayed in order.
        `media=False`: the transport cannot serve pace 'media' (WebRTC).
        """
        if self.draining and self.claims is not None and resume_token:
            # Its session was handed to the store when its connection ended: another replica takes it.
            raise Refused("session_moving", "this server is going away and has handed your session on; "
                          "reconnect with the same token (the proxy sends you to another server)", 503, 1013,
                          {"Retry-After": "1"})
        if self.draining and not (resume_token and self._grace_until is not None):
            # During a drain's grace a dropped session may still come back to finish here.
            raise Refused("server_shutting_down", "server is shutting down; reconnect later", 503, 1013)
        if resume_token:
            if self._check_token(resume_token) is TokenCheck.FOREIGN:
                return await self._restore(sink, resume_token, client, media)
            session = self.registry.resumable(resume_token)
            if session is None:
                raise Refused("invalid_resume_token", "resume token is unknown, expired or already in use; "
                              "open a new session", 404, 1008)
            if session.settings.pace is Pace.MEDIA and not media:
                raise Refused("pace_unsupported", "this session runs in pace 'media', which only the WebSocket "
                              "endpoint serves; resume it there", 409, 1008)
            # No await from resumable() to here: nobody else can take the session in between.
            self.registry.retoken(session)
            self.registry.reattach(session, sink)
            sink.bind(session, resumed=True)
            dropped = session.backlog.replay(sink)
            if dropped:
                self.metrics.dropped_events.labels("backlog_full").inc(dropped)
                sink.emit(p.error_event("backlog_overflow", f"{dropped} outputs/events produced while you were "
                                        "disconnected did not fit the resume backlog and were dropped; resume "
                                        "sooner to get them all", kind="server_error"))
            self.engine.resumed(session)
            if self.claims is not None:
                await self.claims.bind_token(session, previous=resume_token)
            return session
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
            await self.registry.close(session)
            raise Refused("server_shutting_down", "server is shutting down; reconnect later", 503, 1013)
        session.background = self.background_factory(session)
        self.registry.reattach(session, sink)
        sink.bind(session, resumed=False)
        if self.claims is not None:
            self.claims.keep_log(session)  # before its first step
        self.engine.add(session)
        if self.claims is not None:
            await self.claims.own(session)
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

    # -- the session store (--session-store) ---------------------------------------------------------

    async def _restore(self, sink: OutputSink, token: str, client: str, media: bool) -> Session:
        """A resume whose token another replica issued (it is down, or the proxy sent it here): take the
        session over from the store, with its settings and conversation, under its own id."""
        assert self.claims is not None
        store = self.claims.store
        started = time.monotonic()
        gone = Refused("invalid_resume_token", "resume token is unknown or expired, and its replica cannot be "
                       "reached; open a new session", 404, 1008)
        sid = await store.session_for(token)
        loaded = await store.load(sid) if sid is not None else None
        if sid is None or loaded is None:
            raise gone
        try:
            restored = parse(loaded[1])
        except ValueError as exc:
            log.error("session %s cannot be restored from the store: %s", sid, exc)
            raise Refused("invalid_resume_token", "the stored session behind this resume token could not be "
                          "read; open a new session", 404, 1008) from None
        if restored.settings.pace is Pace.MEDIA and not media:
            raise Refused("pace_unsupported", "this session runs in pace 'media', which only the WebSocket "
                          "endpoint serves; resume it there", 409, 1008)
        claim = await store.claim(sid)
        if claim is None:  # its replica still holds the lease: alive, or dead for less than LEASE_S
            raise Refused("session_busy", "the session is still held by its replica; retry in a moment", 503, 1013,
                          {"Retry-After": "1"})
        try:
            # Its replica died: it may take a place of the restore reserve, above the capacity.
            session = await self.registry.open(client, session_id=sid, reserve=self.config.restore_reserve)
        except Refused as exc:
            await store.hand_off(claim)  # the lease goes, the snapshot stays: another replica may take it
            if exc.code != "server_full":
                raise
            raise Refused("no_room", "no place is free here for your session (its server went away); it is kept "
                          f"for {self.config.resume_grace:g} s after your disconnect: retry with the same token",
                          503, 1013, {"Retry-After": "2"}) from None
        restore(session, restored)
        self.claims.keep_log(session)
        await self.claims.adopt(session, claim, previous_token=token)  # its lease is renewed during a rebuild
        replayed, failed = await self.claims.rebuild(session, self.engine.call)  # the model's state, if it can
        if failed:
            log.warning("session %s: the model's state could not be rebuilt (%s); it starts afresh", sid, failed)
            await self.engine.call(self.model.close, session.state)
            session.state = await self.engine.open_state(sid)
            self.claims.keep_log(session, restart=True)
        session.background = self.background_factory(session)
        self.registry.reattach(session, sink)
        sink.bind(session, resumed=True)
        self.engine.add(session)
        if failed:
            sink.emit(p.error_event("model_state_lost", f"the model's memory of this conversation could not be "
                                    f"rebuilt on this server ({failed}); it starts afresh", kind="server_error"))
        lost = continue_work(session, sink, restored)  # what its client missed; background asked again
        if lost:
            self.metrics.dropped_events.labels("backlog_full").inc(lost)
            sink.emit(p.error_event("backlog_overflow", f"{lost} outputs/events produced while you were "
                                    "disconnected were not carried to this server and are lost", kind="server_error"))
        self.metrics.sessions_restored.inc()
        self.metrics.restore_seconds.observe(time.monotonic() - started)
        log.info("session %s restored from the store (%d conversation entries, %d micro-turns replayed)", sid,
                 len(session.log.entries), replayed)
        return session

    async def sync_store(self) -> None:
        """Renew this replica's leases and write changed snapshots (every STORE_SYNC s, from the reaper).
        A session another replica took over is closed here: it is served there now."""
        if self.claims is None:
            return
        for session in await self.claims.sync(self.registry.sessions()):
            await self.close(session, "session moved to another server", 1001)

    async def detach(self, session: Session, normal: bool, sink: OutputSink | None = None,
                     restore_token: str | None = None, keep_token: str | None = None) -> None:
        """The transport's connection ended. `normal` (the client said goodbye): close the session now;
        otherwise keep it for the resume grace period. A no-op when `sink` no longer owns the session
        (it was resumed elsewhere, or closed). `restore_token`: the connection never delivered the
        rotated token, so the client's old one must keep working. `keep_token`: the client may or may
        not have the rotated token, so the old one works too, until either is used."""
        if session.closed or (sink is not None and session.sink is not sink):
            return
        if normal:
            await self.close(session)
            return
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
        """End a session for good: tell its client why (when `reason`), free its model state and slot."""
        await self.registry.close(session, code, reason)

    async def _free(self, session: Session) -> None:
        """Registry closer: stop the background worker, drop the session from the engine, close its state,
        and forget it in the session store."""
        try:
            await session.background.stop()
        finally:
            await self.engine.close_state(session)
            if self.claims is not None:
                await self.claims.release(session)

    def session(self, session_id: str) -> Session | None:
        """The session (attached or awaiting resume) with this id, whatever its transport."""
        return self.registry.get(session_id)

    # -- a session's input (every transport's) ------------------------------------------------------

    async def push_audio(self, session: Session, audio: Audio) -> None:
        """Client audio, mono float32 at 24 kHz: media pace waits while the session's backlog is full
        (back-pressure), real time drops the oldest (`push_live_audio`)."""
        if session.settings.pace is Pace.MEDIA:
            await self.engine.push_audio_media(session, audio)
        else:
            self.push_live_audio(session, audio)

    def push_live_audio(self, session: Session, audio: Audio) -> None:
        """Real-time audio (RTP comes only this way): what overruns the backlog drops its oldest input,
        and the client is told (an `input_overrun` error, at most one a second)."""
        if not self.engine.push_audio(session, audio):
            return
        box = session.inbox
        now = time.monotonic()
        if now - box.overrun_reported_at > OVERRUN_ERROR_INTERVAL:
            box.overrun_reported_at = now
            self.metrics.client_errors.labels("input_overrun").inc()
            session.emit(p.error_event("input_overrun", "audio is arriving faster than real time; the oldest input "
                                       f"was dropped ({box.chunker.dropped} samples so far). Send at real-time pace "
                                       "or use session.pace 'media'"))

    def push_text(self, session: Session, text: str) -> None:
        """Typed user text for the next micro-turn; raises TextFull past the inbox's bound."""
        session.inbox.add_text(text)
        session.log.add(session.tick * self.engine.period, "user", text, kind="typed")
        self.engine.nudge(session)

    def push_video(self, session: Session, frame: npt.NDArray[np.uint8]) -> None:
        """The newest camera frame; the next micro-turn takes it (an older one not yet taken is replaced)."""
        session.inbox.video = frame

    def respond(self, session: Session) -> None:
        """The client asked for a response: only a hint (the model decides every micro-turn), but a media
        session may be steppable now."""
        self.engine.nudge(session)

    def cancel(self, session: Session) -> None:
        """The client asked to stop the current utterance: the next micro-turn carries the request."""
        session.inbox.cancel = True
        self.engine.nudge(session)

    def clear_input(self, session: Session) -> None:
        """Drop the audio waiting for the coming micro-turns (input_audio_buffer.clear)."""
        session.inbox.chunker.clear()
        session.inbox.room.set()

    def settings_changed(self, session: Session, new: SessionSettings) -> None:
        """The client changed its settings (session.update); a new pace moves it to the other engine loop."""
        pace_changed = new.pace is not session.settings.pace
        session.settings = new
        if pace_changed:
            self.engine.add(session)

    def client_event(self, session: Session, event: dict[str, Any]) -> bool:
        """A client event for the background reasoner; False when the server runs none."""
        return session.background.on_client_event(event)

    # -- server life --------------------------------------------------------------------------------

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
        """Close sessions past their resume grace, and attached sessions idle past the idle timeout."""
        expired = self.registry.expired(now)
        for s in expired:
            log.info("reaping session %s (%s)", s.id, "resume grace over" if s.detached_at else "idle")
            await self.close(s, "" if s.detached_at else "session idle timeout")
        return expired

    async def drain(self, reason: str) -> None:
        """Stop admitting, tell every live session why, and close them all. Runs first on SIGTERM or
        SIGINT (server/cli.py), before the listening sockets close, and again (a no-op) in `stop`.

        With `--drain-grace S` (a replica behind a proxy) it first stops taking new sessions (the agent
        check says `drain`, /healthz 503), tells every session's client (`duplex.session.draining`, with
        its resume token and the seconds left) and lets the sessions go on for up to S seconds or until
        their clients have closed them; then it closes what is left, as without a grace."""
        first = not self.draining
        self.draining = True
        if first and self.config.drain_grace > 0 and len(self.registry):
            await self._drain_grace(reason, self.config.drain_grace)
        self.drained.set()
        for session in self.registry.sessions():
            if self.claims is not None:
                await self.claims.hand_off(session)  # with a store: what is left can still continue elsewhere
        for session in self.registry.sessions():
            try:
                await self.close(session, reason, 1001)
            except Exception:  # one broken session must not keep the others open
                log.exception("closing session %s during drain failed", session.id)

    async def _drain_grace(self, reason: str, grace: float) -> None:
        self._grace_until = time.monotonic() + grace
        self.metrics.drains.inc()
        log.info("draining: %d sessions have %.0f s to finish", len(self.registry), grace)
        moving = self.claims is not None
        for session in self.registry.sessions():
            session.emit({"type": "duplex.session.draining", "event_id": p.new_id("event"), "reason": reason,
                          "seconds_left": grace, "resume_token": session.resume_token, "reconnect": moving,
                          "message": "this server is going away: reconnect with your resume token and the "
                          "session continues on another server" if moving else "this server is going away: "
                          "finish, or open a new session (the proxy sends it to another server); what is left "
                          "is closed when the time is up"})
        try:
            while len(self.registry) and time.monotonic() < self._grace_until:
                await asyncio.sleep(DRAIN_POLL)
        finally:
            self._grace_until = None

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

    async def _reap_forever(self) -> None:
        """Housekeeping: every LAG_PROBE s measure how late the loop woke us; every second reap; every
        --collect-every s (server/limits.py: COLLECT_EVERY) collect garbage and trim the heap."""
        collected = reaped = synced = time.monotonic()
        while True:
            due = time.monotonic() + LAG_PROBE
            await asyncio.sleep(LAG_PROBE)
            now = time.monotonic()
            # A late wake-up is time the loop spent on something else: a slow handler or a pause delays
            # every client's bytes even when the engine keeps its deadlines (the tick thread is separate).
            self.metrics.loop_lag_seconds.observe(max(0.0, now - due))
            if self.claims is not None and now - synced >= STORE_SYNC:
                synced = now
                try:
                    await self.sync_store()
                except Exception:  # the store's upkeep must never stop the reaper
                    log.exception("session store upkeep failed")
            if now - reaped < REAP_EVERY:
                continue
            reaped = now
            try:
                await self.reap(time.monotonic())
            except Exception:  # reaping must never stop; log and go on
                log.exception("session reaper failed")
            if time.monotonic() - collected >= self.config.collect_every:
                started = time.monotonic()
                gc.collect()
                self.metrics.loop_lag_seconds.observe(time.monotonic() - started)  # the loop waited on it too
                # What the collection (and the model's worker threads) freed goes back to the OS, off
                # the loop: a trim walks every heap arena (models/heap.py).
                await asyncio.to_thread(heap.trim)
                collected = time.monotonic()
