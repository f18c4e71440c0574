"""The engine tells a model that waits for late work (`StepBudget`) how long its step may hold the one
inference thread: to its sessions' next deadline, and a bounded delay past any other session's."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from models.base import InteractionModel, TickOutput
from models.echo import EchoModel
from server.engine import STEP_DELAY_S, Engine
from server.metrics import Metrics
from server.sessions import Pace, Session
from streaming.types import TICK_SAMPLES
from tests.manual_clock import ManualClock


class BudgetRecorder(EchoModel):
    """Echo that records the budget of each step (a hand-written fake at the edge: the cascade is the
    real user of the budget, tested in tests/models/test_turns_work.py)."""

    def __init__(self) -> None:
        super().__init__(delay=0)
        self.budgets: list[float | None] = []

    def step_budget(self, seconds: float | None) -> None:
        self.budgets.append(seconds)


class Sink:
    """Where the outputs go (the transport's side; nothing here reads them)."""

    def __init__(self) -> None:
        self.ticks: list[int] = []

    def bind(self, session: Session, resumed: bool) -> None:
        pass

    def deliver(self, out: TickOutput, tick: int) -> None:
        self.ticks.append(tick)

    def end(self, code: int, reason: str) -> None:
        pass

    def emit(self, event: dict[str, Any]) -> None:
        pass


async def _session(engine: Engine, sid: str, pace: Pace) -> Session:
    s = Session(id=sid, resume_token="tok-" + sid, state=None)
    s.state = await engine.open_state(s.id)
    s.settings.pace = pace
    s.sink = Sink()
    engine.add(s)
    return s


async def test_a_step_may_wait_until_its_next_deadline_or_a_little_past_another_sessions() -> None:
    model = BudgetRecorder()
    clock = ManualClock()
    engine = Engine(cast(InteractionModel, model), Metrics(), phase_groups=20, clock=clock)
    try:
        a = await _session(engine, "a", Pace.REALTIME)
        b = await _session(engine, "b", Pace.REALTIME)
        for s in (a, b):
            s.sched.ticking = True
            s.inbox.push(np.zeros(TICK_SAMPLES, dtype=np.float32))
        engine._schedule_at(a, clock.now)  # a is due now
        engine._schedule_at(b, clock.now + 0.05)  # b's slot is 50 ms later in the micro-turn
        await engine._launch([a], realtime=True)
        # b is due in 50 ms; a step of a may run STEP_DELAY_S past that (b starts that much late).
        assert model.budgets[-1] is not None
        assert abs(model.budgets[-1] - (0.05 + STEP_DELAY_S)) < 1e-6, model.budgets
        # Alone, a may use its whole micro-turn: ending past its next deadline would be a miss.
        engine.remove(b)
        clock.now = engine._deadline(a)
        a.inbox.push(np.zeros(TICK_SAMPLES, dtype=np.float32))
        await engine._launch([a], realtime=True)
        assert model.budgets[-1] is not None and abs(model.budgets[-1] - engine.period) < 1e-6, model.budgets
        # Media pace waits for nothing on the clock: no bound.
        m = await _session(engine, "m", Pace.MEDIA)
        m.inbox.push(np.zeros(TICK_SAMPLES, dtype=np.float32))
        await engine._launch([m], realtime=False)
        assert model.budgets[-1] is None
        assert cast(Sink, a.sink).ticks == [0, 1] and cast(Sink, m.sink).ticks == [0]
    finally:
        await engine.stop()
