"""A `duplex cluster` run as a command for a test module: its state file, health and log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from tests.conftest import ROOT, free_port

CHECK_INTERVAL = 0.3  # s between the proxy's checks of each replica
AGENT_SETTLE = 3 * CHECK_INTERVAL + 0.3  # s for the proxy to have heard new figures from every agent


class Cluster:
    def __init__(self, proc: subprocess.Popen[bytes], state_path: Path, log_path: Path) -> None:
        self.proc = proc
        self.state_path = state_path
        self.log_path = log_path

    @property
    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.state_path.read_text())
        return state

    @property
    def url(self) -> str:
        return str(self.state["url"])

    def store_client(self) -> aioredis.Redis:
        """A client of the cluster's Redis: its password is in the cluster's redis.conf (mode 0600)."""
        conf = Path(self.state["workdir"]) / "redis.conf"
        password = next(ln.split()[1] for ln in conf.read_text().splitlines() if ln.startswith("requirepass "))
        return aioredis.Redis.from_url(self.state["store"]["url"], password=password)

    def replica(self, rid: str) -> dict[str, Any]:
        return next(r for r in self.state["replicas"] if r["id"] == rid)

    def health(self, rid: str) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"http://127.0.0.1:{self.replica(rid)['port']}/healthz").json()
        return body

    def wait_idle(self) -> None:
        """Until no replica holds a session and the proxy has heard so from every agent."""
        deadline = time.monotonic() + 10
        while any(self.health(r["id"])["sessions"] for r in self.state["replicas"]):
            assert time.monotonic() < deadline, "sessions were not freed"
            time.sleep(0.1)
        time.sleep(AGENT_SETTLE)




def run_cluster(work: Path, *serve_args: str, replicas: int = 2) -> Iterator[Cluster]:
    """Start `duplex cluster` (echo:1 replicas), yield it once the proxy has the agents' figures, stop
    it with SIGTERM and check that every part is gone."""
    state, log = work / "state.json", work / "cluster.log"
    # Every test client is one address (loopback): the default rate of new sessions per client would
    # refuse a module's worth of them; the per-client cap stays (the replicas hold fewer than it).
    if "--new-sessions-per-minute" not in serve_args:
        serve_args = ("--new-sessions-per-minute", "0", *serve_args)
    cmd = [sys.executable, "-m", "duplex.cli", "cluster", "--replicas", str(replicas), "--port", str(free_port()),
           "--model", "echo:1", "--state", str(state), "--check-interval", str(CHECK_INTERVAL),
           "--workdir", str(work / "run"), "--log-level", "warning", *serve_args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    c = Cluster(proc, state, log)
    deadline = time.monotonic() + 90
    while not state.exists():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    time.sleep(AGENT_SETTLE)  # the proxy has the agents' first answers
    yield c
    pids = [c.state["proxy"]["pid"], c.state["store"]["pid"], *(r["pid"] for r in c.state["replicas"])]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, log.read_text()
    # Ctrl-C / SIGTERM stops every part.
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "duplex cluster: stopped" in log.read_text()
