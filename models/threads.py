"""Thread pools whose threads exist from the start."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def started_pool(threads: int, prefix: str, initializer: Callable[..., object] | None = None,
                 initargs: tuple[Any, ...] = ()) -> ThreadPoolExecutor:
    """A thread pool whose threads all exist already. ThreadPoolExecutor starts them one per task
    while it is busy, so a server's thread count would otherwise grow with its first sessions (or its
    first question), and a soak could not tell that growth from a leak (threads at the end must equal
    those at the start)."""
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=prefix, initializer=initializer,
                              initargs=initargs)
    gate = threading.Barrier(threads + 1)
    for _ in range(threads):
        pool.submit(gate.wait)  # each task holds its thread until all are there
    gate.wait()
    return pool
