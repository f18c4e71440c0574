"""A local cluster of real processes: a Redis server, N duplex replicas and HAProxy, on loopback.

For development and tests (`duplex cluster`, tests/deploy/): it launches the same components a
production layout runs (deploy/README.md), with free ports, one shared cluster secret and one log file
each in a work directory; every replica gets `--session-store` pointing at the Redis server (unless the
serve options name another). It is not an orchestrator: a replica that dies stays dead (that is what a
fail-over test needs); only the proxy and the store are started again if they exit. Every child gets
SIGTERM if the launcher itself dies (PR_SET_PDEATHSIG), so none outlives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from deploy.haproxy import ProxyOptions, Replica, render
from server.auth import read_secret
from server.config import ServerConfig
from server.store import PASSWORD_ENV

log = logging.getLogger("duplex.cluster")

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT = 120.0  # seconds for a replica to load its model and answer /healthz
PROXY_READY_TIMEOUT = 10.0
STOP_TIMEOUT = 15.0  # seconds a child has to exit after SIGTERM (a replica drains first), then SIGKILL
POLL = 0.2  # seconds between the supervisor's looks at its children
STORE_HOST = "127.0.0.1"  # the session store is never reachable from beyond this host


def redis_config(port: int, password: str) -> str:
    """redis.conf for the cluster's store: loopback only, AUTH required, nothing written to disk."""
    if not password.isalnum():
        raise ValueError("the store's password must be letters and digits (it is written into redis.conf)")
    return "\n".join([f"port {port}", f"bind {STORE_HOST}", "protected-mode yes", f"requirepass {password}",
                      'save ""', "appendonly no", ""])


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies, however it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    name: str
    cmd: list[str]
    port: int
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    exit_reported: bool = False  # the supervisor logged that it died
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True, preexec_fn=_die_with_parent)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s; killing it", self.name, timeout)
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class ClusterSpec:
    replicas: int = 2
    port: int = 8000
    host: str = "127.0.0.1"
    model: str | None = None  # None: the server's default
    serve_args: list[str] = field(default_factory=list)  # passed to every `duplex serve`
    workdir: Path | None = None  # logs and haproxy.cfg; None: a new temporary directory
    state_file: Path | None = None
    check_interval: float = 1.0  # seconds between the proxy's checks of each replica
    restart_replicas: bool = False  # a replica that exits is started again (same id and ports): a rolling restart


class LocalCluster:
    """`start()` (raises if any part does not come up, after stopping what did), then `run(stop)`
    supervises until `stop` is set, then `stop()`; or use it as a context manager."""

    def __init__(self, spec: ClusterSpec) -> None:
        if spec.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {spec.replicas}")
        self.spec = spec
        self.workdir = spec.workdir or Path(os.environ.get("TMPDIR", "/tmp")) / f"duplex-cluster-{secrets.token_hex(4)}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        # One secret for the replicas' token MACs; it never leaves their environment.
        self.secret = os.environ.get("DUPLEX_CLUSTER_SECRET") or secrets.token_urlsafe(32)
        self.store_password = secrets.token_hex(32)  # the store's AUTH: only the replicas' environment has it
        key_file = _option(spec.serve_args, "--api-key-file")  # the replicas read it; the health checks need it
        self.api_key = (_option(spec.serve_args, "--api-key") or (read_secret(key_file, "--api-key-file") if key_file
                        else None) or os.environ.get("DUPLEX_API_KEY"))
        self.store: Child | None = None
        self.replicas: list[tuple[Child, Replica]] = []
        self.proxy: Child | None = None
        self.config_path = self.workdir / "haproxy.cfg"
        self.proxy_restarts = 0
        self.store_restarts = 0
        self.replica_restarts = 0  # --restart-replicas

    # -- start --------------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self._start_store()
            self._start_replicas()
            self._start_proxy()
        except BaseException:
            self.stop()
            raise
        self.write_state()

    def _start_store(self) -> None:
        """Redis on loopback only, whatever --host says (the replicas are on this host), with a password:
        in a config file only its owner reads, never in argv (`ps` shows argv to every user)."""
        port = free_port(STORE_HOST)
        config = self.workdir / "redis.conf"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(redis_config(port, self.store_password))
        self.store = Child("redis", ["redis-server", str(config)], port, self.workdir / "redis.log")
        self.store.start()
        _wait_port(STORE_HOST, port, self.store, PROXY_READY_TIMEOUT)

    @property
    def store_url(self) -> str:
        """No password in it: the replicas get that in their environment (server/store.py: PASSWORD_ENV)."""
        assert self.store is not None
        return f"redis://{STORE_HOST}:{self.store.port}/0"

    def _start_replicas(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "DUPLEX_CLUSTER_SECRET": self.secret,
               PASSWORD_ENV: self.store_password}
        started: list[tuple[Child, str, int]] = []
        for i in range(1, self.spec.replicas + 1):
            rid, port, agent = f"r{i}", free_port(self.spec.host), free_port(self.spec.host)
            model = ["--model", self.spec.model] if self.spec.model else []
            store = [] if _option(self.spec.serve_args, "--session-store") else ["--session-store", self.store_url]
            reserve = [] if _option(self.spec.serve_args, "--restore-reserve") else [
                "--restore-reserve", str(self._reserve())]
            # The proxy sets X-Forwarded-For to each client's address (deploy/haproxy.py): trust it from there.
            proxy = [] if _option(self.spec.serve_args, "--forwarded-allow-ips") else [
                "--forwarded-allow-ips", "127.0.0.1" if self.spec.host in ("0.0.0.0", "::") else self.spec.host]
            cmd = [sys.executable, "-m", "server.cli", "serve", "--host", self.spec.host, "--port", str(port),
                   *model, "--replica-id", rid, "--agent-port", str(agent), *store, *reserve, *proxy,
                   *self.spec.serve_args]
            child = Child(f"replica {rid}", cmd, port, self.workdir / f"replica-{rid}.log", env)
            child.start()  # all at once: they load their models in parallel
            started.append((child, rid, agent))
        for child, rid, agent in started:
            health = self._wait_healthy(child)
            self.replicas.append((child, Replica(rid, self.spec.host, child.port, agent, int(health["capacity"]),
                                                 self._reserve())))

    def _reserve(self) -> int:
        """Each replica's --restore-reserve: the serve options', else, with --max-sessions known, room on
        the others for every session of one dead replica when all are full (ceil(capacity / (N - 1))),
        else the server's default."""
        given = _option(self.spec.serve_args, "--restore-reserve")
        if given is not None:
            return int(given)
        capacity = _option(self.spec.serve_args, "--max-sessions")
        if capacity is not None and self.spec.replicas > 1:
            return -(-int(capacity) // (self.spec.replicas - 1))
        return ServerConfig.restore_reserve

    def _wait_healthy(self, child: Child) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited; its log: {child.log_path}")
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(f"http://{self.spec.host}:{child.port}/healthz", headers=headers, timeout=1.0)
                if r.status_code == 200:
                    body: dict[str, Any] = r.json()
                    return body
            time.sleep(POLL)
        raise RuntimeError(f"{child.name} was not healthy within {READY_TIMEOUT:.0f} s; its log: {child.log_path}")

    def _start_proxy(self) -> None:
        opts = ProxyOptions(bind=self.spec.host, port=self.spec.port, api_key=self.api_key,
                            check_interval_ms=max(100, int(self.spec.check_interval * 1000)),
                            stats_socket=str(self.workdir / "haproxy.sock"))
        text = render([r for _, r in self.replicas], opts)
        # It may hold the API key (for the health check): readable by the owner only.
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.proxy = Child("haproxy", ["haproxy", "-f", str(self.config_path), "-db"], self.spec.port,
                           self.workdir / "haproxy.log")
        self._launch_proxy()

    def _launch_proxy(self) -> None:
        assert self.proxy is not None
        self.proxy.start()
        _wait_port(self.spec.host, self.spec.port, self.proxy, PROXY_READY_TIMEOUT)

    # -- run and stop -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What `--state FILE` holds: where each part listens and its pid (no secret)."""
        assert self.proxy is not None and self.store is not None
        return {
            "url": f"ws://{self.spec.host}:{self.spec.port}/v1/realtime",
            "proxy": {"pid": self.proxy.pid, "port": self.proxy.port, "config": str(self.config_path),
                      "restarts": self.proxy_restarts},
            "store": {"pid": self.store.pid, "port": self.store.port, "url": self.store_url,
                      "restarts": self.store_restarts},
            "replicas": [{"id": r.id, "pid": c.pid, "port": r.port, "agent_port": r.agent_port,
                          "capacity": r.capacity, "reserve": r.reserve} for c, r in self.replicas],
            "replica_restarts": self.replica_restarts,
            "workdir": str(self.workdir),
        }

    def write_state(self) -> None:
        if self.spec.state_file is None:
            return
        tmp = self.spec.state_file.with_suffix(self.spec.state_file.suffix + ".tmp")
        tmp.write_text(json.dumps(self.state(), indent=2) + "\n")
        tmp.replace(self.spec.state_file)  # readers never see half a file

    def supervise_once(self) -> None:
        """One look at the children: a proxy that exited is started again; a dead replica is reported."""
        if self.proxy is not None and not self.proxy.alive():
            code = self.proxy.proc.returncode if self.proxy.proc is not None else None
            log.warning("haproxy exited (%s); starting it again", code)
            self.proxy.stop()  # closes its log
            self.proxy_restarts += 1
            self._launch_proxy()
            self.write_state()
        if self.store is not None and not self.store.alive():
            log.warning("redis-server exited; starting it again (empty: the replicas write their sessions again)")
            self.store.stop()
            self.store_restarts += 1
            self.store.start()
            _wait_port(STORE_HOST, self.store.port, self.store, PROXY_READY_TIMEOUT)
            self.write_state()
        for child, _ in self.replicas:
            if child.proc is not None and child.proc.poll() is not None and not child.exit_reported:
                log.warning("%s exited with %s; its sessions can resume on the others", child.name,
                            child.proc.returncode)
                child.exit_reported = True
                if self.spec.restart_replicas:
                    # Started at once; the proxy's health check admits it again once it answers /healthz.
                    child.stop()  # closes its log
                    child.start()
                    child.exit_reported = False
                    self.replica_restarts += 1
                    log.info("%s started again (pid %d)", child.name, child.pid)
                    self.write_state()

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(POLL):
            try:
                self.supervise_once()
            except RuntimeError:
                log.exception("supervising the cluster failed")

    def stop(self) -> None:
        """The proxy first (no new connection reaches a draining replica), then the replicas (each
        drains: its clients are told why), then the store."""
        if self.proxy is not None:
            self.proxy.stop()
        grace = float(_option(self.spec.serve_args, "--drain-grace") or 0)  # live sessions' time to finish
        threads = [threading.Thread(target=c.stop, args=(STOP_TIMEOUT + grace,))  # they drain in parallel
                   for c, _ in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.store is not None:
            self.store.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _option(args: list[str], name: str) -> str | None:
    """The value of `name VALUE` or `name=VALUE` in a list of command-line arguments."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def _wait_port(host: str, port: int, child: Child, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited; its log: {child.log_path}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{child.name} did not listen on {host}:{port} within {timeout:.0f} s")
