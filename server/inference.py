"""The inference thread: the one thread that owns the model and its state (KV pool).

`open`, `step`, `close` and the model's shutdown all run here, never on the event loop. A batched
step that fails is retried session by session, so that only the failing sessions get an error; a
step that runs far past a micro-turn is reported as hung (it stalls every session of its batch).
The engine (server/engine.py) decides what to step and when; this module only runs it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from models.base import Event, InteractionModel, ModelFeatures, SessionState, TickInput, TickOutput, silence
from server.metrics import Metrics
from server.sessions import Session
from streaming.types import TICK_SAMPLES

log = logging.getLogger(__name__)
T = TypeVar("T")

StepResult = tuple[list[TickOutput], float, float]  # outputs, step start, step end (engine clock)
Batch = list[tuple[SessionState, TickInput]]


def _failed(exc: Exception) -> TickOutput:
    """The output of a session whose step raised: silence and an error event for its client."""
    return TickOutput(silence(), events=[Event("error", {"message": f"model step failed: {exc}"})])


class InferenceThread:
    def __init__(self, model: InteractionModel, features: ModelFeatures, metrics: Metrics,
                 clock: Callable[[], float], hang_after: float) -> None:
        self.model = model
        self.metrics = metrics
        self.clock = clock
        self.hang_after = hang_after  # a step running longer than this is reported as hung (s)
        self._step_budget = features.step_budget
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="duplex-inference")
        self._stepping: dict[int, float] = {}  # batch id -> clock() at its start, while it runs
        self._hung_reported: set[int] = set()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on the inference thread (model open/close, calibration, shutdown)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def submit(self, inputs: Batch, until: float | None) -> asyncio.Future[StepResult]:
        """Queue one batched step now (its place on the thread is taken at once, before any close
        queued later). `until`: when the thread is next needed (real time), else None."""
        return asyncio.get_running_loop().run_in_executor(self._executor, self._step, inputs, until)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    # -- hangs ------------------------------------------------------------------------------------

    def hang(self) -> str | None:
        """None unless a step has run past `hang_after`; then what (for /healthz)."""
        if not self._stepping:
            return None
        self.report_hangs()  # whoever sees a hang first (this or the engine's watchdog) counts it, once
        running = self.clock() - min(self._stepping.values())
        return f"a model step has been running for {running:.1f} s (hung?)" if running > self.hang_after else None

    def report_hangs(self) -> None:
        """Log and count each step running past `hang_after`, once per step."""
        now = self.clock()
        for batch, started in list(self._stepping.items()):
            if now - started > self.hang_after and batch not in self._hung_reported:
                self._hung_reported.add(batch)
                self.metrics.hung_steps.inc()
                log.error("model step running for %.1f s (over %.1f s): the model may be hung; every "
                          "session in its batch is stalled", now - started, self.hang_after)
        self._hung_reported &= set(self._stepping)

    # -- stepping ---------------------------------------------------------------------------------

    async def run(self, inputs: Batch, sessions: Sequence[Session], first: asyncio.Future[StepResult]) -> StepResult:
        """Wait for the step `submit` queued, watched for hangs; if it fails, step each session alone
        so that only the failing ones get an error.

        A model failure is usually one session's input or state; stepping the rest again alone keeps
        them going (each session's output does not depend on its batch: a tested property). A step
        that failed may have advanced some states before raising; the model contract says nothing
        about that, so the retried sessions may skip a micro-turn of model state, never crash.
        """
        key = id(first)
        self._stepping[key] = self.clock()
        try:
            return await self._run(inputs, sessions, first)
        finally:
            del self._stepping[key]

    async def _run(self, inputs: Batch, sessions: Sequence[Session], first: asyncio.Future[StepResult]) -> StepResult:
        try:
            return await first
        except Exception as exc:
            if len(inputs) == 1:
                log.exception("model step failed")
                self.metrics.step_failures.inc()
                t = self.clock()
                return [_failed(exc)], t, t
            log.warning("model step failed for a batch of %d (%s); stepping each session alone", len(inputs), exc)
        outs: list[TickOutput] = []
        t_start = self.clock()
        for one, session in zip(inputs, sessions, strict=True):
            if session.closed:  # closed meanwhile: its state may be freed already, and nobody gets this output
                outs.append(TickOutput(silence()))
                continue
            try:
                out, _, _ = await self.call(self._step, [one])
                outs.extend(out)
            except Exception as exc:
                log.exception("model step failed for one session")
                self.metrics.step_failures.inc()
                outs.append(_failed(exc))
        return outs, t_start, self.clock()

    def _step(self, inputs: Batch, until: float | None = None) -> StepResult:
        """Runs on the inference thread."""
        t_start = self.clock()
        if self._step_budget is not None:
            self._step_budget(None if until is None else max(0.0, until - t_start))
        outs = self.model.step(inputs)
        t_end = self.clock()
        if len(outs) != len(inputs):
            raise RuntimeError(f"model {self.model.name} returned {len(outs)} outputs for {len(inputs)} inputs")
        for out in outs:
            if out.audio.shape != (TICK_SAMPLES,):
                raise RuntimeError(f"model {self.model.name} returned audio of shape {out.audio.shape}")
        return outs, t_start, t_end
