"""Threads: pools whose threads exist from the start, and how many threads torch's matmuls use."""

from __future__ import annotations

import contextlib
import os
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


def set_cpu_threads(threads: int) -> int:
    """One inference thread calls step; let its matmuls use the cores this process may run on.
    `threads`: 0 = every core. Torch is imported here only: the thread pools above need none."""
    import torch

    n = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(n)
    # No inter-op parallelism in one fixed-shape step. Fails if already set or work already ran: harmless.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    return n
