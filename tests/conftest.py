"""Shared fixtures: a real duplex server started as a subprocess on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from models.cascade import CascadeModel

ROOT = Path(__file__).resolve().parents[1]
# Piper without sampling noise: synthesised test speech is the same on every run, so the ASR of it
# (and every test built on that) cannot flake. Servers started by the tests inherit it.
os.environ.setdefault("DUPLEX_TTS_DETERMINISTIC", "1")
ARTIFACTS = ROOT / "artifacts"
READY_POLL_S = 0.05  # seconds between /healthz polls while a server starts


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProc:
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/realtime"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return int(self.proc.returncode)


def start_server(*args: str, tmp_path: Path, env: dict[str, str] | None = None, ready_timeout: float = 120.0,
                 host: str = "127.0.0.1") -> ServerProc:
    """Start `duplex serve` on a free port and wait until /healthz answers."""
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, "-m", "server.cli", "serve", "--host", host, "--port", str(port), *args]
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    server = ServerProc(proc, host, port, log_path)
    deadline = time.monotonic() + ready_timeout
    headers = {"Authorization": f"Bearer {full_env['DUPLEX_API_KEY']}"} if full_env.get("DUPLEX_API_KEY") else {}
    # One client for every poll: httpx.get builds a client (and its TLS context, ~40 ms of CPU) per call,
    # which at 5 polls a second took CPU from the server starting beside it. With cheap polls the
    # interval can be short: the server is used ~25 ms after it answers instead of ~100 ms.
    with httpx.Client(timeout=1.0, headers=headers) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
            try:
                if client.get(f"{server.url}/healthz").status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(READY_POLL_S)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server did not become healthy in {ready_timeout}s:\n{server.log()}")


@pytest.fixture
def duplex_server(tmp_path: Path) -> Iterator[Callable[..., ServerProc]]:
    """Factory fixture: `duplex_server("--model", "echo")` starts a server; all are stopped after the test."""
    started: list[ServerProc] = []

    def factory(*args: str, **kwargs: object) -> ServerProc:
        server = start_server(*args, tmp_path=tmp_path, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def default_cascade() -> Iterator[CascadeModel]:
    """One cascade with the default options for every module that drives it in process (tests/models,
    tests/bench): loading it (Whisper, Smart Turn, Piper, the probe, the worker threads, their warm-up)
    takes ~5-10 s. Each test opens sessions of its own: a conversation's state is per session, so tests
    share the weights and threads only. Imported here, not at the top: most tests never load it."""
    from models.cascade import load_cascade

    m = load_cascade("")
    yield m
    m.shutdown()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`-m serial` (the second part of `make test`): a test module that marks nothing serial is not even
    imported. Collecting every module imports torch, the models and the clients, ~40 s on two cores,
    to run seven modules."""
    if config.getoption("markexpr") != "serial" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return "pytest.mark.serial" not in collection_path.read_text(errors="replace")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a parallel worker, the longest files first (tests/durations.py says why); every worker sorts
    the same way, so their collections stay equal, as pytest-xdist requires."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from tests import durations

        durations.order(items, durations.load())
