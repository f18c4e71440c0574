"""Give the C heap's free memory back to the operating system (glibc `malloc_trim`).

glibc keeps what a program frees inside its heaps, one heap ("arena") per thread that allocates, up to
8 per core, and only shrinks a heap from its top. The cascade's worker threads (Smart Turn, Whisper,
synthesis) and the ASR worker processes allocate and free tens of MB per call in varying sizes, so each
arena's footprint creeps up to its own high-water mark and stays there: the cascade soak's RSS rose for
~25 minutes before it flattened, with nothing leaked. `malloc_trim(0)` walks every arena and returns
whole free pages anywhere in them (MADV_DONTNEED), which turns that creep into a flat line.

No-op (returns False) where the C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _trim_function() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim() -> bool:
    """Release free heap pages now; True if the C library has malloc_trim. Takes ~ms per GB of heap and
    holds each arena's lock meanwhile: call it from housekeeping, never from a micro-turn."""
    fn = _trim_function()
    if fn is None:
        return False
    fn(0)  # ctypes releases the GIL around the call
    return True
