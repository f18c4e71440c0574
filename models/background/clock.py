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

An in-process reasoner (llama.cpp on its own thread) is timed by its `work` clock, the CPU time of its
generation thread, not by the wall: in media pace the foreground steps flat out on every core and the
(niced) generation thread gets a fraction of the CPU it has in real time, where it has a core, so its
wall time stamped answers later than a listener would hear them (v1.0 interruption, seed 2222: the
assistant was talking at 0.75 of the interruptions in media against 0.9 in real time). A request
whose thread does not run (waiting for something) still advances at `WALL_FLOOR` of the wall clock, so
a media run can never stall on it.
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
        self._work = work  # the reasoner's work clock (s of its compute), None: the wall clock
        self.start_tick: int | None = None  # micro-turn whose output started the running request
        self._t0 = 0.0  # wall time the running request started
        self._w0 = 0.0  # work clock then
        self.end_tick = 0  # micro-turn at which the last finished request's end is due

    @property
    def running(self) -> bool:
        return self.start_tick is not None

    def start(self, tick: int) -> None:
        self.start_tick, self._t0 = tick, self._clock()
        self._w0 = self._work() if self._work is not None else 0.0

    def elapsed(self) -> float:
        """How long the running request has run: wall seconds, or its work (with the wall floor)."""
        wall = self._clock() - self._t0
        if self._work is None:
            return wall
        return max(self._work() - self._w0, wall * WALL_FLOOR)

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
