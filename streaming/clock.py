"""Absolute-deadline pacing: tick n is due at t0 + n * period, so errors never accumulate."""

import asyncio
import math
import time
from collections.abc import Callable


class DeadlineClock:
    def __init__(self, period: float, t0: float | None = None, now: Callable[[], float] = time.monotonic):
        if period <= 0:
            raise ValueError("period must be positive")
        self.period = period
        self._now = now
        self.t0 = now() if t0 is None else t0

    def deadline(self, n: int) -> float:
        return self.t0 + n * self.period

    def index_at(self, t: float) -> int:
        """The first tick index whose deadline is at or after t."""
        return max(0, math.ceil((t - self.t0) / self.period - 1e-9))

    def lateness(self, n: int) -> float:
        """Seconds past tick n's deadline (negative when early)."""
        return self._now() - self.deadline(n)

    async def sleep_until(self, n: int) -> float:
        """Sleep until tick n is due; returns the lateness on wake-up (>= 0 unless woken early)."""
        delay = self.deadline(n) - self._now()
        if delay > 0:
            await asyncio.sleep(delay)
        return self.lateness(n)
