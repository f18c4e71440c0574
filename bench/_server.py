"""How a benchmark starts (or finds) the duplex server it measures, and reads its metrics.

- `ServerUnderTest`: a `duplex serve` subprocess on a free loopback port, with extra environment, its
  log kept in a file (so the reliability instruments see tracebacks and "Task exception was never
  retrieved": a loop or task that died without killing the process), and kill / restart / terminate
  handles with the exit status.
- `RemoteServer`: the same handle on a server someone else started (`--url`).
- `local_server`: a context manager yielding a fresh server's base URL, for benches that only need that.
- `scrape` and the histogram helpers: the server's Prometheus /metrics, read between two moments.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


READY_POLL_S = 0.05  # seconds between /healthz polls while a server starts


def _answers(client: httpx.Client, url: str) -> bool:
    """The server at `url` answers /healthz with 200."""
    try:
        return client.get(url + "/healthz").status_code == 200
    except httpx.HTTPError:
        return False


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
        self._dir = tempfile.TemporaryDirectory(prefix="duplex-bench-")
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
        self.port = self.port or free_port()  # a restart keeps the port, so clients find it again
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it; closed below
        cmd = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               *self.args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        deadline = time.monotonic() + self.ready_timeout
        # One client for every poll: httpx.get builds a client (and its TLS context, ~40 ms of CPU) per
        # call, CPU taken from the server starting beside it; cheap polls can come every READY_POLL_S.
        with httpx.Client(timeout=2.0) as client:
            while not _answers(client, self.url):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"duplex serve {' '.join(self.args)} exited with {self.proc.returncode}:\n"
                                       f"{self.log_tail()}")
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"server did not answer /healthz within {self.ready_timeout:.0f} s:\n"
                                       f"{self.log_tail()}")
                time.sleep(READY_POLL_S)
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


@contextmanager
def local_server(*args: str, env: dict[str, str] | None = None, ready_timeout: float = 180.0) -> Iterator[str]:
    """Yield the base http URL of a fresh `duplex serve *args` on loopback (logging warnings and worse
    unless args say otherwise); stop it afterwards."""
    with ServerUnderTest("--log-level", "warning", *args, env=env, ready_timeout=ready_timeout) as server:
        yield server.url


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (enough for our own counters and histograms)."""
    return parse_metrics(httpx.get(url + "/metrics", headers=headers, timeout=5).text)


def parse_metrics(text: str) -> dict[str, float]:
    """The samples of a Prometheus text exposition: {'name{labels}': value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def histogram_above(metrics: dict[str, float], before: dict[str, float], name: str, le: str) -> int:
    """Observations of histogram `name` made between two scrapes that exceeded bucket bound `le`."""
    key = f'{name}_bucket{{le="{le}"}}'
    total = metrics.get(name + "_count", 0.0) - before.get(name + "_count", 0.0)
    return int(total - (metrics.get(key, 0.0) - before.get(key, 0.0)))


def histogram_quantile(before: dict[str, float], after: dict[str, float], name: str, q: float) -> float | None:
    """Quantile of the observations made between two scrapes (bucket deltas, interpolated as PromQL does)."""
    from bench.load import bucket_quantile

    buckets: dict[float, float] = {}
    for key, value in after.items():
        if key.startswith(name + "_bucket{le="):
            le = key.split('le="')[1].split('"')[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = value - before.get(key, 0.0)
    return bucket_quantile(buckets, q)
