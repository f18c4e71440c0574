"""Shared parts of the reliability instruments (bench.reliability: fuzz, soak, chaos).

- `proc_sample`: RSS, open descriptors and threads of a process and its descendants, read from /proc
  (no server endpoint).
- `fit_slope` / `fit_line`: least-squares slope of samples against time (and its standard error).
- `rss_bytes`: the resident set of a list of processes, cheaply.
- `LoopLag`: how much of a lateness the measuring client's own event loop accounts for.
- `table`: a plain text table for the reports.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

@dataclass
class ProcSample:
    t: float  # monotonic seconds
    rss_bytes: int
    fds: int
    threads: int
    rss_parts: list[int] = field(default_factory=list)  # RSS bytes of each process: the server, then its workers


def descendants(pid: int) -> list[int]:
    """The processes started by `pid`, and theirs (the cascade's ASR workers), from /proc."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])  # field 4, after the name
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parent.items() if p in frontier]
        found += kids
        frontier = kids
    return found


def proc_sample(pid: int) -> ProcSample | None:
    """RSS, open file descriptors and threads of a local process and its descendants (worker
    processes are part of the server's footprint), from /proc; None if the process is gone."""
    total = ProcSample(time.monotonic(), 0, 0, 0)
    for i, p in enumerate([pid, *descendants(pid)]):
        try:
            rss = _rss_of(p)
            total.rss_bytes += rss
            total.rss_parts.append(rss)
            total.fds += len(os.listdir(f"/proc/{p}/fd"))
            total.threads += len(os.listdir(f"/proc/{p}/task"))
        except OSError:
            if i == 0:
                return None  # the server itself is gone
    return total


def fit_line(ts: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares slope dy/dt and its standard error; None with fewer than 3 points.

    The standard error assumes independent residuals; samples taken closer together than the signal's
    own bursts are not, so read it as a lower bound on how far the slope could be from the truth."""
    if len(ts) < 3 or max(ts) - min(ts) <= 0:
        return None
    t, y = np.asarray(ts, float), np.asarray(ys, float)
    dt = t - t.mean()
    sxx = float(dt @ dt)
    slope = float(dt @ (y - y.mean())) / sxx
    residual = y - y.mean() - slope * dt
    se = float(np.sqrt(float(residual @ residual) / (len(t) - 2) / sxx))
    return slope, se


def fit_slope(ts: list[float], ys: list[float]) -> float | None:
    """Least-squares slope dy/dt; None with fewer than 3 points."""
    line = fit_line(ts, ys)
    return None if line is None else line[0]


def rss_bytes(pids: list[int]) -> int | None:
    """Summed resident set of `pids` from /proc/PID/statm (cheap enough to read every second); None if
    the first (the server) is gone. Processes that ended meanwhile count 0."""
    total = 0
    for i, p in enumerate(pids):
        try:
            total += _rss_of(p)
        except OSError:
            if i == 0:
                return None
    return total


def _rss_of(pid: int) -> int:
    """Resident bytes of one process (/proc/PID/statm: pages, second field); OSError if it is gone."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Fixed-width text table of `columns` from each row."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def progress(tool: str, message: str) -> None:
    print(f"[{tool}] {message}", file=sys.stderr, flush=True)


class LoopLag:
    """How late this process's own event loop woke a timer due every `every` s: the measuring client's
    share of any lateness it reports. Keeps the stalls (wall time, ms) of `keep_ms` or more."""

    def __init__(self, every: float = 0.05, keep_ms: float = 20.0, limit: int = 50_000) -> None:
        self.every, self.keep_ms, self.limit = every, keep_ms, limit
        self.max_ms = 0.0
        self.stalls: list[tuple[float, float]] = []  # (time.time() at wake-up, ms late)

    async def run(self, until: float) -> None:
        while time.monotonic() < until:
            due = time.monotonic() + self.every
            await asyncio.sleep(self.every)
            late_ms = max(0.0, time.monotonic() - due) * 1000
            self.max_ms = max(self.max_ms, late_ms)
            if late_ms >= self.keep_ms and len(self.stalls) < self.limit:
                self.stalls.append((time.time(), round(late_ms, 1)))

    def stalled_during(self, start: float, end: float, min_ms: float) -> bool:
        """Did the loop stall by `min_ms` or more in all, at wake-ups between wall times `start` and `end`?

        Stalls add up: a loaded client loses its loop several times while one echo is awaited (a
        /metrics scrape, a burst of 256 sessions' messages after the last stall), each under the
        lateness but together over it. A wake-up up to its own stall after `end` still counts: the
        arrival time is read by this same loop, so an echo that came during a stall is timed at its end.
        """
        return sum(ms for t, ms in self.stalls if start <= t <= end + ms / 1000) >= min_ms

    def explained(self, late_at: list[tuple[float, float]], late_ms: float) -> int:
        """Late echoes (arrival wall time, ms added) that would have been on time (under `late_ms`)
        without the stalls of this loop while they were awaited: the measuring client's, not the server's."""
        return sum(self.stalled_during(t - ms / 1000, t, ms - late_ms) for t, ms in late_at)
