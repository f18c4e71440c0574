"""The proxy's cost: echo round-trip through HAProxy against straight to a replica, in one run.

    python -m bench.cluster [--rounds 300]

Starts `duplex cluster` (deploy/cluster.py: Redis, one echo:0 replica, HAProxy) on loopback as a
command (bench imports no deploy code), opens one
media-pace session through the proxy and one straight to the replica, and alternates between them: send
one micro-turn of PCM16, time until its `response.output_audio.delta` arrives. Alternating cancels drift
(CPU frequency, other load) between the two paths. The rest of the issue's cluster benchmarks (kill -9
fail-over, rolling restart, native replay) need the session store, which is not built yet.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

TICK = 4800


async def _session(url: str) -> ClientConnection:
    ws = await connect(url, max_size=16 << 20)
    while json.loads(await ws.recv())["type"] != "duplex.session.resume":
        pass
    await ws.send(json.dumps({"type": "session.update", "session": {"pace": "media"}}))
    while json.loads(await ws.recv())["type"] != "session.updated":
        pass
    return ws


async def _round_trip(ws: ClientConnection, pcm: bytes) -> float:
    started = time.perf_counter()
    await ws.send(pcm)
    while True:
        ev = json.loads(await asyncio.wait_for(ws.recv(), 5))
        if ev["type"] == "response.output_audio.delta":
            assert base64.b64decode(ev["delta"]) == pcm
            return (time.perf_counter() - started) * 1000


async def measure(proxy_url: str, direct_url: str, rounds: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(0)
    conns = {"proxy": await _session(proxy_url), "direct": await _session(direct_url)}
    out: dict[str, list[float]] = {k: [] for k in conns}
    for i in range(rounds + 20):
        for name in (("proxy", "direct") if i % 2 else ("direct", "proxy")):
            pcm = rng.integers(-8000, 8000, TICK, dtype=np.int16).tobytes()
            ms = await _round_trip(conns[name], pcm)
            if i >= 20:  # warm-up: first connections, first steps
                out[name].append(ms)
    for ws in conns.values():
        await ws.close()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        state_path = Path(tmp) / "state.json"
        cluster = subprocess.Popen(
            [sys.executable, "-m", "duplex.cli", "cluster", "--replicas", "1", "--port", str(_free_port()),
             "--model", "echo:0", "--state", str(state_path), "--workdir", tmp, "--max-sessions", "4",
             "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not state_path.exists():
                if cluster.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"duplex cluster did not start; logs in {tmp}")
                time.sleep(0.2)
            state = json.loads(state_path.read_text())
            time.sleep(2.5)  # the proxy has the agent's first answer
            direct = f"ws://127.0.0.1:{state['replicas'][0]['port']}/v1/realtime"
            res = asyncio.run(measure(state["url"], direct, args.rounds))
        finally:
            cluster.send_signal(signal.SIGTERM)
            cluster.wait(60)
    for name, ms in res.items():
        a = np.array(ms)
        print(f"{name:6s} n={len(a)} p50 {np.percentile(a, 50):.2f} ms  p99 {np.percentile(a, 99):.2f} ms  "
              f"max {a.max():.2f} ms")
    p99 = {k: float(np.percentile(v, 99)) for k, v in res.items()}
    print(f"proxy cost at p99: {p99['proxy'] - p99['direct']:+.2f} ms (floor: <= +2 ms)")


if __name__ == "__main__":
    main()
