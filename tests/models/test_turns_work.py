"""The cascade's worker pools: warm-up reaches every thread of a pool (each has a heap arena of its own);
the step clock that bounds a real-time step's waits for late work."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

import pytest

from models.turns.work import LATE, Job, StepClock, Workers


def test_on_every_thread_runs_once_on_each_thread_at_the_same_time() -> None:
    workers = Workers({"a": 3, "b": 1})
    seen: list[str] = []
    lock = threading.Lock()
    inside = 0
    most_inside = 0

    def call() -> None:
        nonlocal inside, most_inside
        with lock:
            inside += 1
            most_inside = max(most_inside, inside)
            seen.append(threading.current_thread().name)
        time.sleep(0.05)
        with lock:
            inside -= 1

    try:
        workers.on_every_thread("a", call)
        assert len(seen) == 3 and len(set(seen)) == 3, seen  # one call per thread, none twice
        assert all(name.startswith("cascade-a") for name in seen), seen
        assert most_inside == 3  # all at once: no thread could take a second call
        seen.clear()
        workers.on_every_thread("b", call)
        assert len(seen) == 1 and seen[0].startswith("cascade-b")
    finally:
        workers.close()


def test_late_jobs_of_one_step_share_its_grace_and_a_slow_step_says_where_its_time_went(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Five sessions whose due work is late cost the step one grace, not five (a missed deadline each)."""
    clock = StepClock(grace=0.05, slow=0.0)
    late: list[Job[None]] = [Job(Future(), due=3, name="eot") for _ in range(5)]  # futures nobody completes: late work
    clock.start()
    taken = []
    for job in late:
        with clock.timed("smart turn"):
            taken.append(job.take(3, clock.left()))
    assert taken == [(False, None)] * 5  # each left for the next micro-turn
    assert clock.left() == 0.0  # the first wait used the whole grace; the other four did not wait
    assert 0.04 <= clock.spent["smart turn"] < 0.5, clock.spent
    caplog.set_level(logging.WARNING, logger="models.turns.work")
    clock.finish(batch=5)
    lines = [r.getMessage() for r in caplog.records if "slow cascade step" in r.getMessage()]
    assert len(lines) == 1 and "5 sessions" in lines[0] and "smart turn" in lines[0], lines
    clock.start()
    clock.finish(batch=1)  # within a second of the last line: not logged again
    assert len([r for r in caplog.records if "slow cascade step" in r.getMessage()]) == 1


def test_waits_get_what_the_micro_turn_leaves_after_the_steps_own_work() -> None:
    """A step past its micro-turn is a missed deadline for every session in it: a long grace must not
    make one on a busy machine. Waits themselves are not the step's work."""
    clock = StepClock(grace=0.15, slow=10.0, period=0.2, reserve=0.03)
    clock.start()
    assert 0.14 < clock.left() <= 0.15  # nothing known about the work yet: the whole grace
    with clock.timed("smart turn", wait=True):
        Job(Future(), due=1, name="eot").take(1, clock.left())  # a late job: waits the whole grace
    clock.finish(batch=1)
    assert clock.work < 0.05, "the wait is not counted as the step's work"
    clock.start()
    assert clock.left() > 0.14, "after a step that only waited, the next one may wait the whole grace"
    with clock.timed("vad"):
        time.sleep(0.1)  # a step doing 100 ms of work
    clock.finish(batch=8)
    clock.start()
    assert 0.03 < clock.left() <= 0.2 - 0.03 - 0.1 + 0.005, clock.left()  # what 200 ms leaves after 100 + 30
    clock.finish(batch=8)
    for _ in range(40):  # quiet steps: the bound relaxes again (decaying maximum)
        clock.start()
        clock.finish(batch=1)
    clock.start()
    assert clock.left() > 0.14


def test_idle_counts_every_job_until_it_finishes_or_is_cancelled() -> None:
    """`Workers.idle` gates work that is only worth doing on a free machine (the sooner end-of-turn ask)."""
    workers = Workers({"a": 1})
    release = threading.Event()
    try:
        assert workers.idle()
        running = workers.submit("a", 0, release.wait, 5.0)
        queued = workers.submit("a", 0, time.sleep, 0.0)  # behind the running one: a queued job counts too
        assert not workers.idle()
        assert queued.future.cancel()
        assert not workers.idle()  # the running one is still there
        release.set()
        running.future.result(timeout=5.0)
        deadline = time.monotonic() + 5.0  # the done callback runs just after the result is set
        while not workers.idle() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert workers.idle()
        workers.close()
        with pytest.raises(RuntimeError):  # a closed pool takes nothing, and counts nothing
            workers.submit("a", 0, time.sleep, 0.0)
        assert workers.idle()
    finally:
        release.set()
        workers.close()


def test_a_job_says_when_it_is_due_and_settles_a_late_or_failed_answer_as_none() -> None:
    """What the native model's checks use of a `Job` (the cascade's use `take`): due at its micro-turn, late by
    how many, an answer that has not arrived is given up (cancelled, counted as late work under its name)."""
    late: Future[str] = Future()
    job = Job(late, 5, "test words")
    assert not job.is_due(4) and job.is_due(5) and job.late_by(7) == 2
    assert not job.arrived(0.0)
    before = LATE.count
    assert job.settle(0.0) is None and late.cancelled() and LATE.count == before + 1
    done: Future[str] = Future()
    done.set_result("okay")
    assert Job(done, 5).arrived(0.0) and Job(done, 5).settle(0.0) == "okay"
    failed: Future[str] = Future()
    failed.set_exception(RuntimeError("model gone"))
    assert Job(failed, 5).settle(0.0) is None
