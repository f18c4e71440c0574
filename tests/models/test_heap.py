"""models.heap.trim gives freed C-heap pages back to the OS (what keeps a long cascade run's RSS flat)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path

import pytest

from models import heap


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim and /proc are Linux's")
def test_trim_returns_freed_heap_pages_that_free_alone_keeps() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    # 64 MB in 4 kB blocks (below the mmap threshold: they live in the heap), each touched so it is
    # resident; the last one stays allocated and pins the heap's top, so free() cannot shrink it.
    blocks = [libc.malloc(4096) for _ in range(16_384)]
    assert all(blocks)
    for b in blocks:
        libc.memset(b, 1, 4096)
    for b in blocks[:-1]:
        libc.free(b)
    before = _rss_kb()
    assert heap.trim()
    after = _rss_kb()
    libc.free(blocks[-1])
    assert before - after > 32_000, (before, after)  # most of the 64 MB is given back
