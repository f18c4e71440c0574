"""The real-time schedule: each session's next deadline, on a grid of phase slots.

A micro-turn (`period`) is cut into `groups` phase slots `grid = period / groups` apart. A real-time
session ticks once per micro-turn, in one slot: slot boundary `k` is due at `t0 + k * grid` (a
`DeadlineClock` with the grid as its period: absolute deadlines, no drift), and a session's next
deadline is the boundary `Schedule.mark` names; each tick moves it on by `groups`, one micro-turn.
Sessions in the same slot are stepped in one batch; more groups mean less waiting for input that
arrives just after a shared tick, but smaller batches (bench/latency.py measures both).

`Schedule` is the engine's per-session state (server/engine.py), private to it; `PhaseGrid` is the
arithmetic. Neither knows sessions' input or the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from streaming.clock import DeadlineClock


@dataclass
class Schedule:
    """The engine's per-session scheduling state (server/engine.py). Nothing else reads or writes it."""

    ticking: bool = False  # real-time: the clock runs for this session (from its first input on)
    mark: int = 0  # slot boundary of the next deadline (real-time pace): micro-turn * groups + slot
    ready_at: float = 0.0  # monotonic time the newest whole micro-turn of input completed
    catch_up: bool = False  # step once extra as soon as possible (a surplus persisted)
    surplus_streak: int = 0
    in_flight: int = 0  # steps submitted and not yet delivered


class PhaseGrid:
    """Slot boundaries `t0 + k * grid`, `groups` of them per micro-turn of `period` seconds."""

    def __init__(self, period: float, groups: int, now: Callable[[], float]) -> None:
        if groups < 1:
            raise ValueError("phase groups must be >= 1")
        self.period = period
        self.groups = groups
        self._now = now
        self.clock = DeadlineClock(period / groups, now=now)

    @property
    def grid(self) -> float:
        """Spacing of phase slots (s)."""
        return self.clock.period

    @property
    def t0(self) -> float:
        return self.clock.t0

    def start(self) -> None:
        """Boundary 0 is now (the engine starts)."""
        self.clock = DeadlineClock(self.grid, now=self._now)

    def set_groups(self, groups: int) -> None:
        """`groups` slots per micro-turn from now on, on the same time origin."""
        if groups < 1:
            raise ValueError("phase groups must be >= 1")
        self.groups = groups
        self.clock = DeadlineClock(self.period / groups, t0=self.clock.t0, now=self._now)

    def deadline(self, s: Schedule) -> float:
        return self.clock.deadline(s.mark)

    def place(self, s: Schedule, t: float) -> None:
        """Put `s` on the first slot boundary at or after `t`."""
        s.mark = self.clock.index_at(t)

    def advance(self, s: Schedule) -> None:
        """The tick due at `s`'s deadline was taken: the next is one micro-turn on, in the same slot."""
        s.mark += self.groups

    def rephase(self, s: Schedule, now: float, guard: float) -> bool:
        """A whole micro-turn of input completed at `now`: tick in the first slot after it (plus `guard`).
        Returns whether the session's next deadline moved.

        Each arrival places the session's next tick; a chunk that comes a little late next time is
        waited for (the engine's `late_input`), so there is no need to hold the tick back for the worst
        recent jitter: targeting the latest of several recent arrivals let one late chunk delay the
        next ones by its lateness, which was most of the p99.
        """
        phase = (now - self.t0) % self.period
        slot = math.ceil((phase + guard) / self.grid - 1e-9) % self.groups
        if slot != s.mark % self.groups or self.deadline(s) > now + self.period:
            self.place(s, now + ((slot * self.grid - phase) % self.period))
            return True
        return False
