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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class RequestClock:
    """One session's clock for its running background request (at most one runs at a time)."""

    def __init__(self, period: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.period = period
        self._clock = clock
        self.start_tick: int | None = None  # micro-turn whose output started the running request
        self._t0 = 0.0  # wall time the running request started
        self.end_tick = 0  # micro-turn at which the last finished request's end is due

    @property
    def running(self) -> bool:
        return self.start_tick is not None

    def start(self, tick: int) -> None:
        self.start_tick, self._t0 = tick, self._clock()

    def due(self) -> int:
        """The micro-turn at which something produced now is delivered."""
        if self.start_tick is None:
            return 0  # nothing running (e.g. an error after cancellation): the next micro-turn
        return self.start_tick + 1 + math.floor((self._clock() - self._t0) / self.period)

    def finish(self) -> None:
        if self.start_tick is not None:
            self.end_tick = self.due()
        self.start_tick = None

    def wait_before(self, tick: int) -> float:
        """Wall seconds to wait before micro-turn `tick` may be stepped in media pace (0: go)."""
        if self.start_tick is None:
            return 0.0
        return max(0.0, self._t0 + (tick - self.start_tick) * self.period - self._clock())
