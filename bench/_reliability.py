"""Shared parts of the reliability instruments (bench.fuzz, bench.soak, bench.chaos).

- `ServerUnderTest`: a `duplex serve` subprocess on a free loopback port whose log is kept in a file,
  so the instruments can see tracebacks and "Task exception was never retrieved" (a loop or task that
  died without killing the process), and can restart it after a crash.
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
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench._server import ROOT, _free_port

# Log lines that mean something died inside a process that is still running.
FAULT_PATTERNS = re.compile(
    r"Traceback \(most recent call last\)|Task exception was never retrieved|Exception in ASGI application"
    r"|Exception in callback|RecursionError|Fatal Python error"
)


# Tracebacks that a dependency logs for a fault it handled correctly. uvicorn's WebSocket protocol
# logs one at ERROR for a text frame that is not UTF-8, after closing the connection with 1007 as
# RFC 6455 requires: the client's fault, answered correctly, not a dead task of ours.
HANDLED_BY_DEPENDENCY = ("Invalid UTF-8 sequence received from client",)
LOG_RECORD = re.compile(r"^(\d{4}-\d\d-\d\d \d|ERROR:|WARNING:|INFO:|DEBUG:|CRITICAL:)")  # a new log record starts
UNRETRIEVED = "Task exception was never retrieved:"  # prefix of such faults in `new_faults`
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _exit_on_sigterm() -> None:
    """A bench stopped with SIGTERM (kill, a CI timeout) unwinds like Ctrl-C, so the servers it
    started are stopped by their `with` blocks instead of outliving it (seen: a killed soak left its
    cascade server running). Only where nobody chose a handler, and only from the main thread."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


class ServerUnderTest:
    """One `duplex serve` subprocess: start, health, log faults since a mark, stop with its exit status."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, ready_timeout: float = 180.0) -> None:
        self.args = list(args)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._dir = tempfile.TemporaryDirectory(prefix="duplex-reliability-")
        self.log_path = Path(self._dir.name) / "server.log"
        self.restarts = 0
        self._log_pos = 0  # byte offset of the log already scanned by `new_faults`

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    def start(self) -> ServerUnderTest:
        _exit_on_sigterm()
        self.port = self.port or _free_port()  # a restart keeps the port, so clients find it again
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it; closed below
        cmd = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               *self.args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        deadline = time.monotonic() + self.ready_timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"duplex serve {' '.join(self.args)} exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"server did not answer /healthz within {self.ready_timeout:.0f} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.2)
        self._log_pos = self.log_path.stat().st_size  # start-up noise is not a fault
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def healthz(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(self.url + "/healthz", timeout=5).json()
        return body

    def new_faults(self) -> list[str]:
        """Fault lines logged since the last call (each with the line before it for context)."""
        if not self.log_path.exists():
            return []
        with open(self.log_path, "rb") as f:
            f.seek(self._log_pos)
            text = f.read().decode("utf-8", errors="replace")
            self._log_pos = f.tell()
        lines = text.splitlines()
        out: list[str] = []
        skip_until = -1
        for i, line in enumerate(lines):
            if i <= skip_until or not FAULT_PATTERNS.search(line):
                continue
            if i and any(h in lines[i - 1] for h in HANDLED_BY_DEPENDENCY):
                continue
            if "Task exception was never retrieved" in line and i + 1 < len(lines):
                # Logged when the dead task is garbage-collected, long after it died: name the task, not a case.
                m = re.search(r"name='([a-z-]+?)(?:-sess_\w+)?'.*exception=(\w+)", lines[i + 1])
                out.append(f"{UNRETRIEVED} {m.group(1)} {m.group(2)}" if m else f"{UNRETRIEVED} {lines[i + 1][:120]}")
            else:
                # The exception's own line (unindented `Name: message` after the frames) names it.
                last = next((b for b in lines[i + 1:i + 400] if re.match(r"^[A-Za-z_][\w.]*(: |$)", b)
                             and not b.startswith(("Traceback", "During handling", "The above", "future:"))), "")
                out.append(f"{line.strip()} {last.strip()}".strip())
            # One log record is one fault: its chained tracebacks ("During handling of ...") are not more.
            skip_until = next((j - 1 for j in range(i + 1, len(lines)) if LOG_RECORD.match(lines[j])), len(lines))
        return out

    def log_lines(self, needle: str, limit: int = 10) -> list[str]:
        """The first `limit` lines of the whole log (start-up included) that contain `needle`."""
        if not self.log_path.exists():
            return []
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip() for line in f if needle in line][:limit]

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def sessions_held(self) -> int | None:
        try:
            return int(self.healthz().get("sessions", 0))
        except (httpx.HTTPError, ValueError):
            return None

    def restart(self) -> None:
        self.kill()
        self.restarts += 1
        self.start()

    def terminate(self, timeout: float) -> tuple[int | None, float]:
        """SIGTERM; (exit status or None when it had to be killed, seconds it took)."""
        assert self.proc is not None
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None, time.monotonic() - t0
        return self.proc.returncode, time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.terminate(20)
        self._dir.cleanup()

    def __enter__(self) -> ServerUnderTest:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


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


class RemoteServer(ServerUnderTest):
    """A server someone else started (`--url`): no log to read, no restart, no exit status."""

    def __init__(self, url: str) -> None:
        super().__init__()
        from urllib.parse import urlsplit

        from bench.load import check_loopback

        check_loopback(url)
        self.port = int(urlsplit(url).port or 80)

    def start(self) -> ServerUnderTest:
        if not self.healthy(5):
            raise RuntimeError(f"no duplex server answers {self.url}/healthz")
        return self

    def alive(self) -> bool:
        return self.healthy(5)

    def restart(self) -> None:
        raise RuntimeError(f"the server at {self.url} stopped answering; restart it and run again")

    def terminate(self, timeout: float) -> tuple[int | None, float]:
        return None, 0.0

    def close(self) -> None:
        self._dir.cleanup()


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
