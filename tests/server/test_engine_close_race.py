"""A session closed right after the engine took its micro-turn of input is never stepped after its
state was closed (a cascade soak stepped one whose recogniser had been returned: ASRError)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from models.base import InteractionModel, TickInput, TickOutput
from models.echo import EchoModel, EchoState
from server.engine import Engine
from server.metrics import Metrics
from server.sessions import Pace, Session
from streaming.types import TICK_SAMPLES


class ClosedStateGuard(EchoModel):
    """Echo that records a step of a state it already closed, as the cascade's recogniser would fail.
    A hand-written fake at the edge: no real model closes on cue."""

    def __init__(self) -> None:
        super().__init__(delay=0)
        self.closed: set[int] = set()
        self.stepped_after_close = 0
        self.steps = 0

    def close(self, state: EchoState) -> None:
        self.closed.add(id(state))
        super().close(state)

    def step(self, batch: Sequence[tuple[EchoState, TickInput]]) -> list[TickOutput]:
        self.steps += 1
        self.stepped_after_close += sum(id(state) in self.closed for state, _ in batch)
        return super().step(batch)


async def test_a_close_queued_after_the_input_was_taken_runs_after_the_step() -> None:
    model = ClosedStateGuard()
    engine = Engine(cast(InteractionModel, model), Metrics())
    await engine.start()
    try:
        session = Session(id="sess_race", resume_token="tok", state=None)
        session.state = await engine.open_state(session.id)
        session.settings.pace = Pace.MEDIA
        engine.add(session)
        session.inbox.push(np.zeros(TICK_SAMPLES, dtype=np.float32))
        engine.remove(session)  # this test drives the step itself
        # The race, made certain: the micro-turn's input is taken, then the client leaves before the
        # event loop runs anything else (the registry marks it closed, then frees its state).
        task = engine._launch([session], realtime=False)
        session.closed = True
        await engine.close_state(session)
        await task
        assert model.steps == 1
        assert model.stepped_after_close == 0, "the session's state was closed before its last step ran"
    finally:
        await engine.stop()
