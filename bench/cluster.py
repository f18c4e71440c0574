"""Cluster figures on one machine: the proxy's cost, and a replica killed with -9.

    python -m bench.cluster [--rounds 300]             # echo round-trip through HAProxy vs straight
    python -m bench.cluster --failover [--sessions 6] [--reserve 1]  # kill -9 of a replica: resumed, time, intact
    python -m bench.cluster --rolling [--sessions 6]   # SIGTERM each replica in turn: conversations kept, gaps

Each starts `duplex cluster` (deploy/cluster.py: Redis, echo replicas, HAProxy) on loopback as a
command (bench imports no deploy code).

Round trip: one media-pace session through the proxy and one straight to the replica, alternating:
send one micro-turn of PCM16, time until its `response.output_audio.delta` arrives. Alternating cancels
drift (CPU frequency, other load) between the two paths.

`--failover`: three echo replicas with room for 4 sessions each, `--sessions` sessions spread over them
(each with its own instructions), then `kill -9` of the replica holding the first; every session it
held resumes through the proxy (retrying while the dead replica's lease lapses) and sends audio.
Reported: sessions resumed of those on it, the time from the kill to each one's first audio delta
(p50, p99), and how many came back with their own instructions. `--reserve N` is each replica's
`--restore-reserve` (places above capacity for a dead replica's sessions).

`--rolling`: three echo replicas (`duplex cluster --restart-replicas --drain-grace 10`), `--sessions`
real-time clients in conversation through the proxy (200 ms of audio every 200 ms, each with its own
instructions); each replica in turn gets SIGTERM (its agent says down, its clients get
`duplex.session.draining` with their token), every client reconnects with the token and goes on, the
replica exits and is started again, then the next. Reported: conversations kept (same session, own
instructions, audio flowing at the end) and lost, and the gap each moved client heard (from the last
audio delta before the move to the first one after it; p50, p99, max).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection

from bench._rolling import rolling
from bench.wsclient import open_session, recv_event, start

TICK = 4800


async def _session(url: str, instructions: str = "") -> tuple[ClientConnection, str]:
    """A media-pace session; returns it and its resume token."""
    ws, resume = await start(url, pace="media", instructions=instructions)
    return ws, str(resume["resume_token"])


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
    conns = {"proxy": (await _session(proxy_url))[0], "direct": (await _session(direct_url))[0]}
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


async def _resume(url: str, token: str, killed: float,
                  budget: float = 10.0) -> tuple[float, str, ClientConnection] | None:
    """Resume until served: (seconds from the kill to the first audio delta, its instructions, the
    connection, left open so that the session keeps its place while the others resume), or None."""
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # refused while the lease lapses: try again
            ws = await open_session(url, resume_token=token)
            first = await recv_event(ws)
            if first["type"] == "session.created":
                instructions = str(first["session"]["instructions"])
                await ws.send(bytes(2 * TICK))
                while json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] != "response.output_audio.delta":
                    pass
                return time.monotonic() - killed, instructions, ws
            await ws.close()
        await asyncio.sleep(0.05)
    return None


async def failover(state: dict[str, Any], sessions: int) -> None:
    url = str(state["url"])
    reserve = state["replicas"][0]["reserve"]  # what duplex cluster gave each replica
    held = [(*await _session(url, f"session {i}"), f"session {i}") for i in range(sessions)]
    await asyncio.sleep(1.0)  # the replicas' store syncs (every 0.4 s) have written every session
    victim = held[0][1].partition(".")[0]
    on_it = [(ws, token, text) for ws, token, text in held if token.startswith(victim + ".")]
    pid = next(r["pid"] for r in state["replicas"] if r["id"] == victim)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    results = await asyncio.gather(*(_resume(url, token, killed) for _, token, _ in on_it))
    done = [r for r in results if r is not None]
    intact = sum(1 for r, (_, _, text) in zip(results, on_it, strict=True) if r is not None and r[1] == text)
    times = np.array([r[0] for r in done]) if done else np.array([float("nan")])
    print(f"kill -9 of {victim} ({sessions} sessions on 3 x 4 places, restore reserve {reserve}): "
          f"{len(done)}/{len(on_it)} sessions resumed, {intact}/{len(on_it)} with their "
          f"instructions; kill to first audio delta p50 {np.percentile(times, 50):.2f} s, "
          f"p99 {np.percentile(times, 99):.2f} s (floor: all, p99 <= 2 s)")
    for ws in [ws for ws, *_ in held] + [r[2] for r in done]:
        with contextlib.suppress(Exception):
            await ws.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _cluster(replicas: int, max_sessions: int, *extra: str) -> Iterator[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        state_path = Path(tmp) / "state.json"
        print(f"starting duplex cluster ({replicas} echo replicas x {max_sessions} sessions) ...", flush=True)
        cluster = subprocess.Popen(
            [sys.executable, "-m", "duplex.cli", "cluster", "--replicas", str(replicas), "--port", str(_free_port()),
             "--model", "echo:0", "--state", str(state_path), "--workdir", tmp, "--max-sessions", str(max_sessions),
             "--log-level", "warning", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not state_path.exists():
                if cluster.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"duplex cluster did not start; logs in {tmp}")
                time.sleep(0.2)
            time.sleep(2.5)  # the proxy has the agents' first answers
            yield {**json.loads(state_path.read_text()), "state_path": str(state_path)}
        finally:
            cluster.send_signal(signal.SIGTERM)
            cluster.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--failover", action="store_true", help="measure a kill -9 fail-over instead")
    parser.add_argument("--rolling", action="store_true", help="measure a rolling restart under load instead")
    parser.add_argument("--sessions", type=int, default=6, help="--failover/--rolling: sessions over the 3 replicas")
    parser.add_argument("--reserve", type=int, default=None,
                        help="each replica's --restore-reserve (default: duplex cluster's, room for one dead "
                             "replica's sessions: 2 for 3 x 4)")
    parser.add_argument("--json", action="store_true", help="--rolling: print the figures as JSON too")
    args = parser.parse_args()
    reserve = [] if args.reserve is None else ["--restore-reserve", str(args.reserve)]
    if args.failover:
        with _cluster(3, 4, *reserve) as state:
            asyncio.run(failover(state, args.sessions))
        return
    if args.rolling:
        with _cluster(3, 4, "--restart-replicas", "--drain-grace", "10", "--check-interval", "0.5", *reserve) as state:
            result = asyncio.run(rolling(Path(state["state_path"]), args.sessions, settle=2.0))
        if args.json:
            print(json.dumps(result))
        return
    with _cluster(1, 4) as state:
        direct = f"ws://127.0.0.1:{state['replicas'][0]['port']}/v1/realtime"
        res = asyncio.run(measure(state["url"], direct, args.rounds))
    for name, ms in res.items():
        a = np.array(ms)
        print(f"{name:6s} n={len(a)} p50 {np.percentile(a, 50):.2f} ms  p99 {np.percentile(a, 99):.2f} ms  "
              f"max {a.max():.2f} ms")
    p99 = {k: float(np.percentile(v, 99)) for k, v in res.items()}
    print(f"proxy cost at p99: {p99['proxy'] - p99['direct']:+.2f} ms (floor: <= +2 ms)")


if __name__ == "__main__":
    main()
