"""Off-thread work whose result is used at a fixed micro-turn: the same in media and real-time pace.

Both voices use it: a `Job` is a worker's answer due at a fixed micro-turn. The cascade submits its jobs
through `Workers` and takes them with `Job.take` (postponed while late, within a patience); the native
model's checks (the hand-off's words, the turn check, the overlap's words) with `Job.arrived` and
`Job.settle` (used or given up at its micro-turn).

The cascade's slow parts (Smart Turn, Whisper) run on worker threads that release the GIL
(onnxruntime, CTranslate2), so the tick thread only submits and collects. If results were used "as
soon as they are done", a media-pace run (ticks flat out) would see them at other micro-turns than a
real-time run, and the two would disagree. Instead each job is *due* a fixed number of micro-turns
after it was submitted. In media pace the engine steps a session only once the work due at its next
micro-turn is done (`CascadeModel.pending_work`, waited for on the event loop), so a due job is always
there. In real time a tick waits at most `grace` for it; a job still running then is postponed to the
next micro-turn (the decision it feeds comes a micro-turn later: only on a machine too busy for the
budget), never a reason to stall the tick, and after `PATIENCE_TICKS` it is given up for its fallback.
A job that fails gives `None`; callers fall back to a cheaper answer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from models.threads import started_pool
from streaming.types import TICK_SECONDS

T = TypeVar("T")
_WORK_DECAY = 0.9  # per step: a busy step's work bounds the waits of the next ~20 steps less and less
PATIENCE_TICKS = 25  # 5 s past its due micro-turn a job is given up (an overloaded or stuck worker)
log = logging.getLogger(__name__)


class LateWork:
    """Counts off-thread work used later than its due micro-turn in real time (the machine was too
    busy for the budgets), and says so in the log at most every `every` seconds: that is when real
    time and media pace may differ."""

    def __init__(self, every: float = 10.0) -> None:
        self.count = 0
        self._every = every
        self._logged = -every
        self._lock = threading.Lock()

    def note(self, what: str) -> None:
        with self._lock:
            self.count += 1
            now = time.monotonic()
            if now - self._logged < self._every:
                log.debug("%s late past its micro-turn (%d late so far)", what, self.count)
                return
            self._logged = now
        log.warning("%s late past its micro-turn (%d late so far): the machine is too busy for the budgets; "
                    "decisions come later and real-time and media pace may differ", what, self.count)


LATE = LateWork()


class StepClock:
    """One step's wall clock, on the tick thread: the grace its sessions' waits share, and where its time went.

    A real-time tick may wait `grace` for off-thread work due now (above). The grace is the step's,
    not each session's: five sessions each waiting their own 50 ms for late partials would be a
    250 ms step, a missed deadline for all of them, on exactly the busy machine the grace is for.
    It is also bounded by the step's budget: a step that ends more than a micro-turn after it began
    is a missed deadline for every session in it, and one that runs past the moment another batch
    (another phase slot) is due starts that one late; the engine says when that is (`limit`, from
    models.base.StepBudget). The waits may only use what the budget leaves after the step's own work
    (`reserve` of margin, and the recent steps' work: a decaying maximum, so a load that grows is
    followed at once and one that shrinks a few steps later). On a quiet machine the waits get the
    whole grace; on a machine at capacity they get less, down to nothing.
    The time each kind of wait (and each stage) takes is summed, so a slow step can say why.
    """

    def __init__(self, grace: float, slow: float = 0.1, every: float = 1.0, period: float = TICK_SECONDS,
                 reserve: float = 0.03) -> None:
        self.grace = grace
        self.slow = slow  # a step longer than this (s) is logged with its breakdown
        self._every = every  # at most one such line per `every` seconds
        self._logged = -every
        self._period = period
        self._reserve = reserve
        self.limit: float | None = None  # the engine's bound on the coming step (s; models.base.StepBudget)
        self.work = 0.0  # the recent steps' own work (s, their waits left out): a decaying maximum
        self.t0 = self._until = time.monotonic()
        self.spent: dict[str, float] = {}
        self._waited = 0.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        # What the step may take, waits and work together: a micro-turn, or less if the engine says so.
        budget = (self._period if self.limit is None else min(self._period, self.limit)) - self._reserve
        self._until = self.t0 + max(0.0, min(self.grace, budget - self.work))
        self.spent = {}
        self._waited = 0.0

    def left(self) -> float:
        """How long a wait may still take in this step (s)."""
        return max(0.0, self._until - time.monotonic())

    def add(self, what: str, since: float, wait: bool = False) -> None:
        took = time.monotonic() - since
        self.spent[what] = self.spent.get(what, 0.0) + took
        if wait:
            self._waited += took

    @contextlib.contextmanager
    def timed(self, what: str, wait: bool = False) -> Iterator[None]:
        """Time a stage; `wait`: it is a wait bounded by `left()` (not the step's own work)."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(what, t0, wait)

    def finish(self, batch: int) -> None:
        """Note the step's own work (for the next steps' wait bound); log a slow step with where its
        time went (rate-limited)."""
        now = time.monotonic()
        total = now - self.t0
        self.work = max(total - self._waited, self.work * _WORK_DECAY)
        if total < self.slow or now - self._logged < self._every:
            return
        self._logged = now
        self.spent["the rest"] = total - sum(self.spent.values())
        parts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in sorted(self.spent.items(), key=lambda kv: -kv[1]))
        log.warning("slow cascade step: %.0f ms for %d sessions (%s)", total * 1e3, batch, parts)


@dataclass
class Timing:
    """When a job was submitted, started on its worker and finished (monotonic s; 0 = not yet)."""

    submitted: float = 0.0
    started: float = 0.0
    finished: float = 0.0

    def describe(self, now: float) -> str:
        """Where a late job's time went, for the warning: queued behind other jobs, or running slowly."""
        if not self.started:
            return f"still queued after {(now - self.submitted) * 1e3:.0f} ms"
        queued = (self.started - self.submitted) * 1e3
        if not self.finished:
            return f"queued {queued:.0f} ms, running for {(now - self.started) * 1e3:.0f} ms"
        return f"queued {queued:.0f} ms, ran {(self.finished - self.started) * 1e3:.0f} ms"


@dataclass
class Job(Generic[T]):
    """A worker's answer, used at micro-turn `due` of its session. The cascade takes it with `take` (postponed
    while late, within a patience); the native model's checks with `arrived` and `settle` (used or given up)."""

    future: Future[T]
    due: int  # the session's micro-turn (its `tick`) at which the result is used
    name: str = ""  # the worker it runs on, or what it is (for the late-work count and the warnings)
    timing: Timing = field(default_factory=Timing)

    def is_due(self, tick: int) -> bool:
        return tick >= self.due

    def late_by(self, tick: int) -> int:
        """Micro-turns past its due one at micro-turn `tick` (0: due now)."""
        return tick - self.due

    def arrived(self, wait: float) -> bool:
        """Whether the answer is in, waited for up to `wait` seconds (it is left running either way)."""
        return arrived(self.future, wait)

    def settle(self, wait: float) -> T | None:
        """The answer due now, waited for up to `wait` seconds; None where it is late (then cancelled and counted
        as late work), was cancelled or failed (`settle`)."""
        return settle(self.future, wait, self.name)

    def cancel(self) -> None:
        self.future.cancel()

    def take(self, tick: int, grace: float) -> tuple[bool, T | None]:
        """(taken, result or None on failure). Not due yet, or due but late within the patience:
        (False, None), ask again next micro-turn."""
        if not self.is_due(tick):
            return False, None
        try:
            return True, self.future.result(timeout=grace)
        except FutureTimeout:
            if self.late_by(tick) < PATIENCE_TICKS:
                LATE.note(f"{self.name} job ({self.timing.describe(time.monotonic())})")
                return False, None  # late: the decision waits a micro-turn, the tick does not
            log.warning("%s job is %d micro-turns past its budget; using the fallback", self.name, self.late_by(tick))
            self.cancel()
            return True, None
        except Exception as e:  # a failed classifier/transcriber must not stop the session
            log.warning("off-thread job failed (%s: %s); using the fallback", type(e).__name__, e)
            return True, None


class Workers:
    """Named thread pools (name -> threads), started with the model and stopped by `close`."""

    def __init__(self, threads: dict[str, int]) -> None:
        self._threads = dict(threads)
        self._pools = {n: started_pool(k, f"cascade-{n}") for n, k in threads.items()}
        self._in_flight = 0  # jobs submitted and not yet finished or cancelled, every pool together
        self._lock = threading.Lock()

    def submit(self, name: str, due: int, fn: Callable[..., T], *args: object) -> Job[T]:
        timing = Timing(time.monotonic())

        def timed() -> T:
            timing.started = time.monotonic()
            try:
                return fn(*args)
            finally:
                timing.finished = time.monotonic()

        with self._lock:
            self._in_flight += 1  # before the job can finish: the count never dips below zero
        try:
            future = self._pools[name].submit(timed)
        except BaseException:  # a closed pool: nothing was queued
            self._done(None)
            raise
        future.add_done_callback(self._done)  # also called when the job is cancelled before it ran
        return Job(future, due, name, timing)

    def _done(self, _: object) -> None:
        with self._lock:
            self._in_flight -= 1

    def idle(self) -> bool:
        """No job is queued or running in any pool: the machine has room for work that is only worth
        doing when it is free."""
        return self._in_flight == 0

    def on_every_thread(self, name: str, fn: Callable[[], object]) -> None:
        """Run `fn` once on each thread of pool `name`, all at the same time, and wait (errors raise)."""
        pool, n = self._pools[name], self._threads[name]
        barrier = threading.Barrier(n)

        def held() -> object:
            barrier.wait(30.0)  # each task keeps its thread until every thread has one: one call per thread
            return fn()

        for f in [pool.submit(held) for _ in range(n)]:
            f.result()

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)


def arrived(job: Future[Any], wait: float) -> bool:
    """Whether a worker's answer is in, waited for up to `wait` seconds (it is left running either way)."""
    if not job.done():
        futures.wait([job], timeout=max(0.0, wait))
    return job.done()


def settle(job: Future[T], wait: float, what: str) -> T | None:
    """A worker's answer due now, waited for up to `wait` seconds: None where it is late (then cancelled and
    counted with the late work as `what`), was cancelled, or failed (logged); the caller decides without it."""
    if not arrived(job, wait):
        job.cancel()
        LATE.note(what)
        return None
    if job.cancelled():  # the model shut down under it
        return None
    error = job.exception()
    if error is not None:
        log.warning("%s failed (%s); decided without it", what, error)
        return None
    return job.result()
