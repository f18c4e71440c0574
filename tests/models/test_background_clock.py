"""A background request on the session's virtual clock: timed by the reasoner's compute when it has a
work clock (media pace starves the generation thread of the CPU it has in real time)."""

from __future__ import annotations

import time

import pytest

from models.background.clock import WALL_FLOOR, RequestClock
from tests.manual_clock import ManualClock


def test_a_request_is_stamped_by_the_compute_it_got_not_the_wall_time_it_waited() -> None:
    wall, work = ManualClock(), ManualClock()
    clock = RequestClock(0.2, clock=wall, work=work)
    clock.start(10)
    # Media pace: 1 s of wall time in which the niced generation thread got 0.3 s of a core.
    wall.now += 1.0
    work.now += 0.3
    assert clock.due() == 10 + 1 + 1  # 0.3 s of work: the micro-turn after 10 + 1, not 10 + 1 + 5
    assert clock.wait_before(13) == pytest.approx(0.3)  # 0.6 s of work by micro-turn 13: 0.3 s to go
    assert clock.wait_before(11) == 0.0  # by wall time it would wait for nothing up to micro-turn 15
    # Its thread stalls (waiting for something, not computing): the request still moves, on the wall.
    wall.now += 10.0
    assert clock.elapsed() == pytest.approx(11.0 * WALL_FLOOR)
    assert clock.wait_before(13) == 0.0
    clock.finish()
    assert not clock.running and clock.wait_before(100) == 0.0


def test_without_a_work_clock_the_wall_clock_times_it() -> None:
    wall = ManualClock()
    clock = RequestClock(0.2, clock=wall)
    clock.start(0)
    wall.now += 0.45
    assert clock.due() == 3 and clock.wait_before(4) == pytest.approx(0.35)


def test_the_embedded_reasoner_times_its_generation_thread() -> None:
    pytest.importorskip("llama_cpp")
    from models.background.base import WorkClock
    from models.background.llamacpp_backend import LlamaCppConfig, LlamaCppReasoner

    reasoner = LlamaCppReasoner(LlamaCppConfig())
    try:
        assert isinstance(reasoner, WorkClock)
        before = reasoner.work_clock()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.3:  # this thread computes; the idle generation thread does not
            sum(range(10_000))
        assert reasoner.work_clock() - before < 0.05
        busy = reasoner._thread.submit(lambda: sum(range(3_000_000)))  # work on the generation thread
        busy.result()
        assert reasoner.work_clock() - before > 0.01
    finally:
        reasoner._thread.shutdown()
