"""Give the C heap's free memory back to the operating system (glibc `malloc_trim`).

glibc keeps what a program frees inside its heaps, one heap ("arena") per thread that allocates, up to
8 per core, and only shrinks a heap from its top. The cascade's worker threads (Smart Turn, Whisper,
synthesis) and the ASR worker processes allocate and free tens of MB per call in varying sizes, so each
arena's footprint creeps up to its own high-water mark and stays there: the cascade soak's RSS rose for
~25 minutes before it flattened, with nothing leaked. `malloc_trim(0)` walks every arena and returns
whole free pages anywhere in them (MADV_DONTNEED), which turns that creep into a flat line.

`tune_for_server` caps the number of arenas at server start (its docstring says why). Both are no-ops
(return False) where the C library is not glibc (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

M_ARENA_MAX = -8  # mallopt parameter number, from glibc's malloc.h
ARENA_MAX = 4  # glibc's default is 8 per core; every thread that allocates may get its own


@functools.cache
def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


@functools.cache
def _trim_function() -> Any:
    fn = getattr(_libc(), "malloc_trim", None)
    if fn is None:
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


def tune_for_server(arena_max: int = ARENA_MAX) -> bool:
    """Cap the number of heap arenas, before the model's threads start allocating.

    glibc gives each new thread that allocates its own arena, up to 8 per core (then threads share),
    and each arena keeps its own high-water mark: the cascade's dozen threads (tick, Whisper, Smart
    Turn, synthesis, the loop's helpers) each holding a peak is RSS that one shared peak would not
    need. Four arenas still keep two cores' threads from queueing on one lock.
    A user's own setting (GLIBC_TUNABLES, MALLOC_* environment variables) is left alone. True if applied.
    """
    if os.environ.get("GLIBC_TUNABLES") or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arena_max))
