"""`llama-server` as a supervised child process: started, health-checked, restarted when it dies.

One supervisor thread owns the child (the event loop never blocks on it): it starts the binary on a
free loopback port, waits for `/health` to answer 200, marks it ready, and waits for it to exit. An exit
that was not asked for is a crash: it is logged with the child's last output lines, counted
(`restarts`, `on_restart`), and the child is started again after a backoff that doubles up to
`MAX_BACKOFF` while crashes follow each other quickly. A child that stops answering `/health` while it
lives (hung) is killed, and so restarted. `stop()` ends it: SIGTERM, then SIGKILL after a grace period.

The child answers only who has its key (a random one per supervisor, given to the child in its
environment, never its argv, which `ps` shows): any local user could otherwise reach its port and use
the model, or read the conversations it holds.

The child is niced (it must never take the foreground's core: the foreground makes a 200 ms deadline
every micro-turn) and dies with this process (PR_SET_PDEATHSIG on Linux): a killed server leaves no
llama-server behind holding memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

log = logging.getLogger(__name__)

MAX_BACKOFF = 10.0  # s between restarts at most
STABLE_AFTER = 30.0  # s of running after which the next crash restarts at once again
HEALTH_PERIOD = 2.0  # s between health checks of a running child
HEALTH_TIMEOUT = 3.0  # s a health check may take
HEALTH_FAILURES = 5  # consecutive failed checks after which a live child counts as hung
TAIL_LINES = 40  # of the child's output, kept for crash reports
API_KEY_ENV = "LLAMA_API_KEY"  # where llama-server reads its --api-key from


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _child_setup(nice: int) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec: no logging, no locks
        if nice:
            with contextlib.suppress(OSError):
                os.nice(nice)
        with contextlib.suppress(Exception):  # Linux: die with the parent (1 = PR_SET_PDEATHSIG)
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)

    return setup


class ChildServer:
    """Supervises one child HTTP server (module docstring). `argv(port)` builds its command line."""

    def __init__(self, argv: Callable[[int], list[str]], name: str = "llama-server", host: str = "127.0.0.1",
                 nice: int = 10, start_timeout: float = 120.0,
                 on_ready: Callable[[str], None] | None = None,
                 on_restart: Callable[[str], None] | None = None) -> None:
        self._argv = argv
        self.api_key = secrets.token_urlsafe(24)  # the child requires it on every endpoint but /health
        self.name = name
        self.host = host
        self.nice = nice
        self.start_timeout = start_timeout
        self.on_ready = on_ready  # called (supervisor thread) with the base URL each time a child is up
        self.on_restart = on_restart  # called (supervisor thread) with the reason of each unasked exit
        self.url = ""  # http://host:port of the running child ("" while none is up)
        self.restarts = 0  # unasked exits (crashes, hangs) so far
        self.pid: int | None = None
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # the child's last output lines
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._first: Future[None] = Future()  # the first start's outcome (preload waits on it)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        """A child is up and answered /health (and has not been seen to exit since)."""
        proc = self._proc
        return self._ready.is_set() and proc is not None and proc.poll() is None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> Future[None]:
        """Start supervising (idempotent); the future completes when the first child answers /health,
        or fails with the reason it could not."""
        with self._lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._supervise, name=f"{self.name}-supervisor",
                                                daemon=True)
                self._thread.start()
        return self._first

    def wait_ready(self, timeout: float) -> bool:
        """Block until a child is up (`ready`), at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._ready.wait(min(left, 0.05)):
                time.sleep(0.01)  # set, but the child is gone: the supervisor has yet to notice
        return True

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send the running child `sig` (tests, and the hang check): the supervisor restarts it."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

    def stop(self, grace: float = 5.0) -> None:
        """End the child and the supervisor (blocking; call it off the event loop)."""
        self._stopping.set()
        self._ready.clear()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(grace + HEALTH_TIMEOUT)
        if not self._first.done():
            self._first.set_exception(RuntimeError(f"{self.name} was stopped before it started"))

    # -- the supervisor thread ---------------------------------------------------------------------

    def _supervise(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            began = time.monotonic()
            reason = self._run_once()
            if self._stopping.is_set():
                return
            if not self._first.done():  # the first start failed: say so to whoever waits, keep trying
                self._first.set_exception(RuntimeError(reason))
            self.restarts += 1
            log.error("%s %s; restart %d in %.1f s. Its last output:\n%s", self.name, reason, self.restarts,
                      backoff, "\n".join(self.tail) or "(none)")
            if self.on_restart is not None:
                with contextlib.suppress(Exception):
                    self.on_restart(reason)
            if self._stopping.wait(backoff):
                return
            backoff = 0.5 if time.monotonic() - began > STABLE_AFTER else min(MAX_BACKOFF, backoff * 2)

    def _run_once(self) -> str:
        """Start one child and return when it is gone: why it went."""
        port = free_port(self.host)
        argv = self._argv(port)
        try:
            # OpenMP threads (a ggml build with OpenMP) sleep when idle instead of spinning on a core.
            env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", API_KEY_ENV: self.api_key}
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, preexec_fn=_child_setup(self.nice), env=env)
        except OSError as exc:
            return f"could not be started ({exc})"
        self._proc, self.pid = proc, proc.pid
        reader = threading.Thread(target=self._read_output, args=(proc,), name=f"{self.name}-output",
                                  daemon=True)
        reader.start()
        try:
            url = f"http://{self.host}:{port}"
            t0 = time.monotonic()
            if not self._wait_healthy(proc, url):
                if proc.poll() is None:
                    proc.kill()
                    return f"did not answer /health within {self.start_timeout:g} s of starting and was killed"
                return f"exited with code {proc.returncode} while starting"
            self.url = url
            log.info("%s ready at %s in %.2f s (pid %d)", self.name, url, time.monotonic() - t0, proc.pid)
            if self.on_ready is not None:
                self.on_ready(url)
            self._ready.set()
            if not self._first.done():
                self._first.set_result(None)
            return self._watch(proc, url)
        finally:
            self._ready.clear()
            self.url = ""
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            reader.join(1.0)

    def _wait_healthy(self, proc: subprocess.Popen[bytes], url: str) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and proc.poll() is None and not self._stopping.is_set():
            if _healthy(url, 1.0):
                return True
            time.sleep(0.05)
        return False

    def _watch(self, proc: subprocess.Popen[bytes], url: str) -> str:
        """Until the child exits: check its health now and then; kill it if it hangs."""
        failures = 0
        while True:
            try:
                code = proc.wait(HEALTH_PERIOD)
                return f"exited with code {code}" if code >= 0 else f"was killed by {signal.Signals(-code).name}"
            except subprocess.TimeoutExpired:
                pass
            if self._stopping.is_set():
                return "stopped"
            failures = 0 if _healthy(url, HEALTH_TIMEOUT) else failures + 1
            if failures >= HEALTH_FAILURES:
                proc.kill()
                proc.wait()
                return f"stopped answering /health ({failures} checks in a row) and was killed"

    def _read_output(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.tail.append(line)
                log.debug("%s: %s", self.name, line)


# Loopback only: no proxy from the environment may stand between us and our child.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _healthy(url: str, timeout: float) -> bool:
    try:
        with _OPENER.open(url + "/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
