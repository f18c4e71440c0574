"""A background request on the session's virtual clock: timed by the reasoner's compute when it has a
work clock (media pace starves the generation thread of the CPU it has in real time)."""

from __future__ import annotations

import time

import pytest

from models.background.clock import WALL_FLOOR, RequestClock, SharedWork
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


def test_a_request_behind_another_sessions_counts_the_wait_from_the_shared_moment() -> None:
    """Two media sessions in lockstep share one reasoner. While they step, the reasoner's work clock
    runs ahead of them; a request asked at shared micro-turn 12 must count its wait from the work
    that micro-turn stands for, not from the work done by the time the question reached the server."""
    wall, work = ManualClock(), ManualClock(50.0)
    shared = SharedWork(work)
    a = RequestClock(0.2, clock=wall, work=work)
    a.start(10, work_at=shared.now(10))  # session A: micro-turn 0 is shared micro-turn 0
    shared.add(a, 0)
    assert shared.now(10) == 50.0 and a.position(12) == pytest.approx(50.4)
    work.now += 1.0  # A's answer: 1 s of work done while the sessions stepped 2 micro-turns
    b = RequestClock(0.2, clock=wall, work=work)
    b.start(7, work_at=shared.now(12))  # session B: its micro-turn 7 is shared micro-turn 12
    assert b.elapsed() == pytest.approx(0.6)  # A's work after micro-turn 12 is B's wait
    assert b.due() == 7 + 1 + 3  # from the reasoner's work now it would be 8: heard 3 micro-turns early
    # With nothing running the shared clock is the work clock.
    assert SharedWork(work).now(12) == work.now
    a.finish()
    assert a.position(12) is None


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


def test_the_embedded_reasoner_counts_tokens_at_their_measured_cost() -> None:
    """Once loaded, the work clock is tokens times their cost (models/background/token_clock.py):
    compute on the generation thread that evaluates no token does not move it, so neither does a
    busy machine stretching each token's CPU time."""
    pytest.importorskip("llama_cpp")
    import asyncio

    from models.background.llamacpp_backend import LlamaCppConfig, LlamaCppReasoner
    from models.background.token_clock import eval_counts

    reasoner = LlamaCppReasoner(LlamaCppConfig(max_tokens=12))
    try:
        reasoner.preload().result()
        cost = reasoner._tokens.cost
        assert cost is not None and 0 < cost.prompt < 0.5 and 0 < cost.decode < 0.5
        llm = reasoner._llm
        before, counts0 = reasoner.work_clock(), reasoner._thread.submit(eval_counts, llm).result()
        reasoner._thread.submit(lambda: sum(range(3_000_000))).result()  # compute, but no token
        assert reasoner.work_clock() == before

        async def answer() -> None:
            async for _ in reasoner.stream([{"role": "user", "content": "Name a colour."}], []):
                pass

        asyncio.run(answer())
        counts1 = reasoner._thread.submit(eval_counts, llm).result()
        assert counts0 is not None and counts1 is not None and counts1[1] > counts0[1]
        expected = (counts1[0] - counts0[0]) * cost.prompt + (counts1[1] - counts0[1]) * cost.decode
        assert reasoner.work_clock() - before == pytest.approx(expected)
    finally:
        reasoner._thread.shutdown()
