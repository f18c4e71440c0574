"""A clock that moves only when a test moves it (for code that takes its clock as a callable)."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
