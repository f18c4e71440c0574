"""Opt-in memory diagnostics for locating RSS growth in a long-running server.

Off unless `DUPLEX_TRACEMALLOC=PATH` is set when `duplex serve` starts. Then Python allocations are
traced (`tracemalloc`, `DUPLEX_TRACEMALLOC_FRAMES` frames each, default 8; 0 = no tracing), and every SIGUSR1 appends a
report to PATH: RSS, what Python has allocated, what glibc's heap holds and how much of it is free
(fragmentation shows as RSS growing while Python's allocations do not), and the allocation sites and
object types that grew since the previous report. Tracing costs CPU and memory: never in production.

    DUPLEX_TRACEMALLOC=/tmp/mem.txt duplex serve ...   # then, every few minutes:  kill -USR1 <pid>
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import signal
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType

ENV_PATH = "DUPLEX_TRACEMALLOC"
ENV_FRAMES = "DUPLEX_TRACEMALLOC_FRAMES"
TOP = 25  # allocation sites and object types listed per report


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def malloc_stats() -> dict[str, int] | None:
    """glibc's heap figures (bytes): `arena` (main + thread arenas, from the OS), `in_use`, `free`
    (held but unused: fragmentation or cache), `mmapped`; None when not glibc >= 2.33."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    m = fn()
    return {"arena": m.arena, "in_use": m.uordblks, "free": m.fordblks, "mmapped": m.hblkhd}


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class MemoryReporter:
    """Appends one report per `dump()` to `path`, each compared with the one before."""

    def __init__(self, path: Path, frames: int = 8) -> None:
        self.path = path
        if frames > 0 and not tracemalloc.is_tracing():  # 0: RSS, heap and object types only (no tracing cost)
            tracemalloc.start(frames)
        self._snapshot: tracemalloc.Snapshot | None = None
        self._types: Counter[str] = Counter()
        self.reports = 0
        self._full_started = 0.0
        self._dumping = False
        self.full_pauses: list[float] = []  # seconds of each automatic full collection since the last report
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        """Times the collector's full collections: each one stops the event loop while it runs."""
        if info.get("generation") != 2 or self._dumping:  # the report's own collections are not the server's
            return
        if phase == "start":
            self._full_started = time.perf_counter()
        elif self._full_started:
            self.full_pauses.append(time.perf_counter() - self._full_started)
            self._full_started = 0.0

    def dump(self) -> None:
        pauses, self.full_pauses = self.full_pauses, []
        self._dumping = True
        try:
            self._write(pauses)
        finally:
            self._dumping = False

    def _write(self, pauses: list[float]) -> None:
        # What only the cycle collector can free: objects in reference cycles that plain reference
        # counting never releases. Between full collections this garbage (and the buffers it holds)
        # piles up, which raises the heap's high-water mark even though nothing leaks.
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            cyclic = Counter(type(o).__qualname__ for o in gc.garbage)
            gc.garbage.clear()
        finally:
            gc.set_debug(0)
        gc.collect()  # now really free it: garbage that is merely uncollected is not a leak
        snapshot = None
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__),
                 tracemalloc.Filter(False, "<frozen importlib._bootstrap>")])
        types = Counter(type(o).__qualname__ for o in gc.get_objects())
        traced, peak = tracemalloc.get_traced_memory()
        lines = [f"=== report {self.reports} at {time.strftime('%H:%M:%S')} pid {os.getpid()}: "
                 f"rss {_rss_bytes() / 2**20:.2f} MB, python traced {traced / 2**20:.2f} MB (peak {peak / 2**20:.2f}), "
                 f"gc objects {sum(types.values())} (frozen {gc.get_freeze_count()}), full collections so far "
                 f"{gc.get_stats()[2]['collections']}"]
        heap = malloc_stats()
        if heap is not None:
            lines.append("malloc: " + ", ".join(f"{k} {v / 2**20:.2f} MB" for k, v in heap.items()))
        lines.append(f"automatic full collections since the last report: {len(pauses)}, longest "
                     f"{max(pauses, default=0.0) * 1000:.1f} ms, total {sum(pauses) * 1000:.1f} ms")
        lines.append(f"cyclic garbage since the last report: {sum(cyclic.values())} objects; "
                     + ", ".join(f"{t} {n}" for t, n in cyclic.most_common(TOP)))
        if self.reports:
            lines.append(f"-- top {TOP} allocation sites by growth since report {self.reports - 1}:")
            old = self._snapshot
            grew = [] if snapshot is None or old is None else snapshot.compare_to(old, "traceback")
            for stat in grew[:TOP]:
                lines.append(f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+7d} blocks "
                             f"(now {stat.size / 1024:.1f} KiB)")
                lines += [f"      {frame.filename}:{frame.lineno}" for frame in stat.traceback[-4:]]
            grown = sorted(((n - self._types.get(t, 0), t, n) for t, n in types.items()), reverse=True)[:TOP]
            lines.append(f"-- object types by growth since report {self.reports - 1}:")
            lines += [f"{d:+8d} {t} (now {n})" for d, t, n in grown if d > 0]
        with open(self.path, "a") as f:
            f.write("\n".join(lines) + "\n")
        self._snapshot, self._types = snapshot, types
        self.reports += 1


def install_from_env() -> MemoryReporter | None:
    """Start tracing and dump a report on every SIGUSR1 when DUPLEX_TRACEMALLOC is set; else nothing."""
    path = os.environ.get(ENV_PATH)
    if not path:
        return None
    try:
        frames = int(os.environ.get(ENV_FRAMES, "8"))
    except ValueError:
        raise SystemExit(f"duplex: {ENV_FRAMES} must be a whole number of frames, "
                         f"got {os.environ[ENV_FRAMES]!r}") from None
    reporter = MemoryReporter(Path(path), frames)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        reporter.dump()

    signal.signal(signal.SIGUSR1, on_signal)
    reporter.dump()  # report 0: the baseline, right after start-up
    return reporter
