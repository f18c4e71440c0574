"""Start a duplex server subprocess for a benchmark (when no --url is given)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_server(*args: str, ready_timeout: float = 180.0) -> Iterator[str]:
    """Yield the base http URL of a fresh `duplex serve` on loopback; stop it afterwards."""
    port = _free_port()
    log = open(os.devnull, "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {proc.returncode}; run `duplex serve {' '.join(args)}` to see why")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not answer /healthz within {ready_timeout}s")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


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
