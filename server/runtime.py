"""Everything a running server holds: model, engine, session registry, metrics, background factory.

Transports (WebSocket, WebRTC) get one `Runtime` and never touch the model directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from models.base import InteractionModel
from models.registry import load_model
from server.admission import HARD_CAP, budget, calibrate
from server.auth import default_origins
from server.config import ServerConfig
from server.engine import Engine
from server.metrics import Metrics
from server.sessions import BackgroundHook, NoBackground, Session, SessionRegistry

log = logging.getLogger(__name__)

BackgroundFactory = Callable[[Session], BackgroundHook]


class Runtime:
    def __init__(self, config: ServerConfig, model: InteractionModel | None = None) -> None:
        self.config = config
        self.metrics = Metrics()
        self._model = model
        self.engine: Engine | None = None
        self.registry: SessionRegistry | None = None
        self.background_factory: BackgroundFactory = lambda session: NoBackground()
        self.draining = False
        self.allowed_origins = default_origins(config.host, config.port) | set(config.allowed_origins)
        self._reaper: asyncio.Task[None] | None = None
        self.started_at = time.time()

    @property
    def model(self) -> InteractionModel:
        assert self._model is not None, "runtime not started"
        return self._model

    async def start(self) -> None:
        """Load the model on the inference thread, measure capacity, start the tick loops."""
        cfg = self.config
        if self._model is None:
            log.info("loading model %s ...", cfg.model)
            loop = asyncio.get_running_loop()
            # Loading imports torch and reads weights: keep it off the event loop.
            self._model = await loop.run_in_executor(None, lambda: load_model(cfg.model, cfg.checkpoint, cfg.device))
        engine = Engine(self.model, self.metrics, phase_groups=cfg.phase_groups or 1, guard=cfg.guard_ms / 1000,
                        late_input=cfg.late_input_ms / 1000)
        self.engine = engine
        groups, capacity = cfg.phase_groups, cfg.max_sessions
        if groups is None or capacity is None:
            cal = await calibrate(engine)
            groups = groups or cal.groups(budget(engine))
            capacity = capacity or cal.capacity(budget(engine), groups, self.model.max_sessions or HARD_CAP)
        engine.set_phase_groups(groups)
        if self.model.max_sessions is not None:
            capacity = min(capacity, self.model.max_sessions)
        log.info("model %s ready; admitting up to %d sessions; %d phase groups (%.1f ms apart)",
                 self.model.name, capacity, groups, engine.grid * 1000)

        async def close_session(session: Session) -> None:
            await session.background.stop()
            await engine.close_state(session)
            self.metrics.sessions_live.set(len(self.registry or ()))

        self.registry = SessionRegistry(capacity, engine.open_state, close_session, cfg.max_backlog_ticks,
                                        cfg.resume_grace, cfg.idle_timeout)
        from server.background import make_background_factory  # late: optional reasoner backends

        self.background_factory = make_background_factory(self)
        await engine.start()
        self._reaper = asyncio.create_task(self._reap_forever(), name="duplex-reaper")

    async def open_session(self) -> Session:
        assert self.registry is not None and self.engine is not None
        session = await self.registry.open()
        session.background = self.background_factory(session)
        self.metrics.sessions_live.set(len(self.registry))
        return session

    async def drain(self, reason: str) -> None:
        """Stop admitting, tell every live session why, and close them all."""
        self.draining = True
        if self.registry is None:
            return
        for session in self.registry.sessions():
            await self.registry.close(session, 1001, reason)

    async def stop(self) -> None:
        await self.drain("server shutting down")
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self.engine is not None:
            await self.engine.stop()

    async def _reap_forever(self) -> None:
        assert self.registry is not None
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.registry.reap(time.monotonic())
                self.metrics.sessions_live.set(len(self.registry))
            except Exception:  # reaping must never stop; log and go on
                log.exception("session reaper failed")
