"""A model loaded once per process and shared by every session (thread-safe, on first use)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Shared(Generic[T]):
    """`get()` builds the object on the first call (under a lock: two sessions opening at once must not
    load the model twice) and returns the same one after that."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._obj: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        with self._lock:
            if self._obj is None:
                self._obj = self._build()
            return self._obj
