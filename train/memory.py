"""Keep freed memory in the training process instead of handing it back to the OS (glibc `mallopt`).

glibc serves every allocation above its mmap threshold (at most 32 MiB on 64-bit) with a fresh
`mmap` and unmaps it on free, so each such tensor is page-faulted in, zeroed by the kernel, page by
page, every time. A training step over whole episodes makes dozens of them per layer (the FFN's
[rows, 2 x 1024] activations and their gradients are 34-67 MB at 100 micro-turns x 1-2 episodes).
On this project's 2-core machine a [8200, 1024] float product took 11.8 ms into a fresh tensor and
1.6 ms with mmap turned off (bench.native.train_throughput's step: docs/training.md). The step's
tensors come and go in the same sizes every step, so the heap reuses them and stops growing after
the first step; the process keeps its peak footprint (the training process, not the server).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameter numbers, from glibc's malloc.h
M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and never trim it (process-wide). False where the C
    library is not glibc (musl, macOS) or refused: then nothing changed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 on error; the largest trim threshold an int can say is ~2 GiB
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
