"""What `Runtime.create` builds before the runtime exists: the model (loaded off the event loop), the
engine with its phase grid, the capacity admission allows, and the background reasoner."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from models.background import Reasoner
from models.background.base import WorkClock
from models.background.clock import SharedWork
from models.background.factory import ReasonerSpec, make_reasoner
from models.base import InteractionModel, Preloading
from models.registry import load_model
from server.admission import HARD_CAP, admitted, budget, calibrate
from server.background import BackgroundSettings, BackgroundWorker, Policy
from server.config import ServerConfig
from server.engine import Engine
from server.metrics import Metrics
from server.sessions import BackgroundHook, NoBackground, Session

log = logging.getLogger(__name__)

BackgroundFactory = Callable[[Session], BackgroundHook]


@dataclass(frozen=True)
class Parts:
    metrics: Metrics
    model: InteractionModel
    engine: Engine  # built, not started
    capacity: int  # sessions admitted at once
    reasoner: Reasoner | None  # shared by every session's background worker
    background_factory: BackgroundFactory


def _report_preload(done: Future[None]) -> None:
    """Runs on the reasoner's thread: a reasoner that failed to start is an error in the log now, not
    only in the first answer (which gets an error chunk, as every answer does until it starts)."""
    if not done.cancelled() and (exc := done.exception()) is not None:
        log.error("background reasoner did not start: %s; answers get an error until it does", exc)


async def build(cfg: ServerConfig, model: InteractionModel | None = None) -> Parts:
    """Load the model on a worker thread, measure capacity, build the reasoner."""
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
        # and their cost to be measured. A failure is raised again by that request. A model that never
        # delegates (`delegates = False`: echo) never pays for it.
        reasoner.preload().add_done_callback(_report_preload)
    return Parts(metrics, model, engine, capacity, reasoner, factory)


def settings_from_config(config: ServerConfig) -> BackgroundSettings:
    """The worker settings the server's options set (None or 0 there: the worker's default)."""
    s = BackgroundSettings(policy=Policy(config.background_policy))
    if config.background_timeout:
        s.request_timeout = float(config.background_timeout)
    if config.background_tool_timeout:
        s.tool_timeout = float(config.background_tool_timeout)
    return s


def make_background_factory(
    cfg: ServerConfig, metrics: Metrics | None = None
) -> tuple[Reasoner | None, Callable[[Session], BackgroundHook]]:
    """Build the server's one reasoner (shared by all sessions; the caller closes it) and a per-session
    worker factory."""
    spec = ReasonerSpec(kind=cfg.background, url=cfg.background_url, model=cfg.background_model,
                        max_tokens=cfg.background_max_tokens, max_sentences=cfg.background_max_sentences,
                        threads=cfg.background_threads or 1, slots=cfg.background_slots,
                        on_restart=None if metrics is None else lambda reason: metrics.background_restarts.inc())
    reasoner = make_reasoner(spec)
    if reasoner is None:
        return None, lambda session: NoBackground()
    settings = settings_from_config(cfg)
    log.info("background reasoner %s (policy %s)", reasoner.name, settings.policy.value)
    shared = SharedWork(reasoner.work_clock) if isinstance(reasoner, WorkClock) else None
    return reasoner, lambda session: BackgroundWorker(session, reasoner, settings, metrics, shared)
