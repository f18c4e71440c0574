"""A background request's progress on the session's virtual clock (its micro-turns).

The reasoner runs on wall-clock time, the foreground on micro-turns. In real-time pace the two are
the same clock; in media pace the foreground steps as fast as it can, so an answer that takes 1.2 s
of wall time would land a few hundred micro-turns "late" and a media run would not be the run a
listener hears. This class makes both paces agree:

- each piece the reasoner produces is stamped with the micro-turn at which it would reach the
  foreground in real time: `start + 1 + floor(elapsed / period)`, where `start` is the micro-turn
  whose output asked for it and `elapsed` the wall time since the request began;
- in media pace, micro-turn `k` is not stepped before the running request has run for
  `(k - start) * period` of wall time (`wait_before`), so everything due by `k` exists when `k`
  is stepped; in real-time pace that condition holds by itself.

So the reasoner really runs at its own speed in both paces (its token timing is recorded as it
streams), and its output is delivered at the same micro-turns, give or take the one micro-turn of
wall-clock jitter a real-time run has anyway. Time is injectable for tests.

In media pace an in-process reasoner (llama.cpp on its own thread) is timed by its `work` clock, not
by the wall: the foreground steps flat out on every core and the (niced) generation thread gets a
fraction of the CPU it has in real time, so its wall time stamped answers later than a listener would
hear them (v1.0 interruption, seed 2222: the assistant was talking at 0.75 of the interruptions in
media against 0.9 in real time). The embedded reasoner's work clock counts the tokens it evaluated at
their cost measured on its thread (models/background/token_clock.py), so a contended machine does not
stretch it either. That is the reasoner on a core of its own: where real time does not give it one,
it runs slower than media pace says (2 real-time sessions on 2 cores: generations took 1.7x their CPU
time, which matched the token costs). A request whose thread does not run (waiting for
something) still advances at `WALL_FLOOR` of the wall clock, so a media run can never stall on it.
Real-time pace needs none of this: a piece is due when it exists, so its requests run on the wall.

Several media sessions share one reasoner. A request that waits behind another session's must count
that wait as it would in real time, so its clock starts not at the reasoner's work now (which may run
ahead of the sessions' virtual time while they step) but where the sessions have got to on their own
clocks (`SharedWork.now`). That needs the sessions to step in lockstep, micro-turn k of every session
before any k + 1: the client's job (bench/fdbench/lockstep.py); without it, each session on its own
still gets the one-session guarantee.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

WALL_FLOOR = 0.1  # a request advances at least this fast against the wall clock (see above)


class RequestClock:
    """One session's clock for its running background request (at most one runs at a time)."""

    def __init__(self, period: float, clock: Callable[[], float] = time.monotonic,
                 work: Callable[[], float] | None = None) -> None:
        self.period = period
        self._clock = clock
        self.work = work  # the reasoner's work clock (s of its compute), None: the wall clock
        self.start_tick: int | None = None  # micro-turn whose output started the running request
        self._t0 = 0.0  # wall time the running request started
        self._w0 = 0.0  # work clock then
        self.end_tick = 0  # micro-turn at which the last finished request's end is due

    @property
    def running(self) -> bool:
        return self.start_tick is not None

    def start(self, tick: int, work_at: float | None = None) -> None:
        """Time a request from micro-turn `tick`; `work_at`: the work clock's reading that stands for
        that micro-turn (`SharedWork.now`), by default its reading now."""
        self.start_tick, self._t0 = tick, self._clock()
        if self.work is not None:
            self._w0 = self.work() if work_at is None else work_at

    def position(self, tick: int) -> float | None:
        """The work clock's reading that micro-turn `tick` stands for, on this request's virtual clock
        (None: nothing running or no work clock). Before the request's start it stands at the start."""
        if self.start_tick is None or self.work is None:
            return None
        return self._w0 + max(0, tick - self.start_tick) * self.period

    def elapsed(self) -> float:
        """How long the running request has run: wall seconds, or its work (with the wall floor)."""
        wall = self._clock() - self._t0
        if self.work is None:
            return wall
        return max(self.work() - self._w0, wall * WALL_FLOOR)

    def due(self) -> int:
        """The micro-turn at which something produced now is delivered."""
        if self.start_tick is None:
            return 0  # nothing running (e.g. an error after cancellation): the next micro-turn
        return self.start_tick + 1 + math.floor(self.elapsed() / self.period)

    def finish(self) -> None:
        if self.start_tick is not None:
            self.end_tick = self.due()
        self.start_tick = None

    def wait_before(self, tick: int) -> float:
        """Wall seconds to wait before micro-turn `tick` may be stepped in media pace (0: go)."""
        if self.start_tick is None:
            return 0.0
        # Work still to be done, in seconds: at least as many wall seconds (the caller asks again after).
        return max(0.0, (tick - self.start_tick) * self.period - self.elapsed())


class SharedWork:
    """One reasoner's work clock as the media sessions sharing it see it (see the module docstring).

    The sessions' micro-turns are counted on one shared clock (a client that steps them in lockstep
    says where each session's micro-turn 0 lies on it: `session.duplex.media_clock`). Each running
    request registers its clock with that offset. `now(tick)` is the work clock's reading, but no later
    than the reading any running request's virtual clock gives shared micro-turn `tick`: the work
    clock may have run ahead while the sessions stepped, and that work lies in their future.
    """

    def __init__(self, work: Callable[[], float]) -> None:
        self.work = work
        self._running: dict[RequestClock, int] = {}  # clock -> shared micro-turn of its session's 0

    def add(self, clock: RequestClock, offset: int) -> None:
        self._running[clock] = offset

    def discard(self, clock: RequestClock) -> None:
        self._running.pop(clock, None)

    def now(self, tick: int) -> float:
        """The work clock's reading that shared micro-turn `tick` stands for."""
        w = self.work()
        for clock, offset in self._running.items():
            pos = clock.position(tick - offset)
            if pos is not None:
                w = min(w, pos)
        return w
