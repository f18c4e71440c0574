"""Server-added latency of the WebSocket path, measured by the client, on the echo model.

For each session a client sends a 200 ms PCM16 chunk exactly when a microphone would have it
(at t_start + (k+1) * 200 ms) and waits for the echo to bring those samples back. The server's
added latency is `received - sent - delay * 200 ms`, where `delay` is the echo model's own delay: it
counts the wait for the session's tick, the step and the transport. Sessions start at random phases
within the micro-turn, as real clients do, which is what phase groups exist for.

    python -m bench.latency --sessions 1,32 --seconds 20 [--phase-groups 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
import time
from contextlib import nullcontext
from typing import Any

import numpy as np
import uvloop

from bench._server import histogram_quantile, local_server, scrape
from bench.wsclient import open_session, set_session

TICK = 4800
PERIOD = 0.2


async def _session(url: str, seconds: float, delay: int, seed: int, start_at: float) -> list[float]:
    rng = np.random.default_rng(seed)
    n = int(seconds / PERIOD)
    chunks = []
    for _ in range(n):
        x = rng.integers(-20000, 20000, TICK).astype("<i2")
        x[x == 0] = 1
        chunks.append(x.tobytes())
    index = {c: k for k, c in enumerate(chunks)}
    sent: dict[int, float] = {}
    lat: list[float] = []
    async with open_session(url) as ws:
        await set_session(ws, pace="realtime")

        async def reader() -> None:
            async for msg in ws:
                ev = json.loads(msg)
                if ev["type"] == "response.output_audio.delta":
                    k = index.get(base64.b64decode(ev["delta"]))
                    if k is not None and k in sent:
                        lat.append(time.monotonic() - sent[k] - delay * PERIOD)
                elif ev["type"] == "error":
                    print(f"server error: {ev['error']}", file=sys.stderr)

        task = asyncio.create_task(reader())
        for k, chunk in enumerate(chunks):
            due = start_at + (k + 1) * PERIOD  # the chunk's last sample exists now
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            sent[k] = time.monotonic()
            await ws.send(chunk)
        await asyncio.sleep((delay + 2) * PERIOD)
        task.cancel()
    return lat


async def _run(base: str, sessions: int, seconds: float, delay: int) -> dict[str, Any]:
    ws_url = base.replace("http", "ws", 1) + "/v1/realtime"
    before = scrape(base)
    now = time.monotonic() + 0.5
    rnd = random.Random(sessions)
    results = await asyncio.gather(*[
        _session(ws_url, seconds, delay, seed=1000 * sessions + i, start_at=now + rnd.random() * PERIOD)
        for i in range(sessions)])
    after = scrape(base)
    lat = np.array([x for r in results for x in r]) * 1000
    expected = sessions * int(seconds / PERIOD)
    lateness = histogram_quantile(before, after, "duplex_tick_lateness_seconds", 0.99)
    missed = after.get("duplex_missed_deadlines_total", 0) - before.get("duplex_missed_deadlines_total", 0)
    turnaround = [histogram_quantile(before, after, "duplex_tick_turnaround_seconds", q) for q in (0.5, 0.99)]
    return {
        "sessions": sessions,
        "chunks_expected": expected,
        "chunks_returned": int(lat.size),
        "latency_ms_p50": round(float(np.percentile(lat, 50)), 2) if lat.size else None,
        "latency_ms_p99": round(float(np.percentile(lat, 99)), 2) if lat.size else None,
        "latency_ms_max": round(float(lat.max()), 2) if lat.size else None,
        "tick_lateness_ms_p99": round(lateness * 1000, 2) if lateness is not None else None,
        # The server's own view (input complete -> output to the transport), from /metrics buckets.
        "server_turnaround_ms_p50": round(turnaround[0] * 1000, 2) if turnaround[0] is not None else None,
        "server_turnaround_ms_p99": round(turnaround[1] * 1000, 2) if turnaround[1] is not None else None,
        "missed_deadlines": int(missed),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", default="1,32", help="comma-separated session counts to run, one after another")
    ap.add_argument("--seconds", type=float, default=20.0, help="audio each session streams")
    ap.add_argument("--delay", type=int, default=1, help="echo delay in micro-turns (subtracted from the result)")
    ap.add_argument("--phase-groups", type=int, default=None, help="server --phase-groups (default: server's)")
    ap.add_argument("--url", default=None, help="use a running server (started with --model echo:DELAY)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.sessions.split(",") if x]
    server_args = ["--model", f"echo:{args.delay}", "--max-sessions", str(max(counts) + 8), "--background", "none"]
    if args.phase_groups is not None:
        server_args += ["--phase-groups", str(args.phase_groups)]
    rows = []
    with local_server(*server_args) if args.url is None else nullcontext(args.url) as base:
        for n in counts:
            print(f"[bench.latency] {n} session(s) x {args.seconds:.0f} s ...", file=sys.stderr, flush=True)
            # uvloop (the server's loop too) keeps the measuring client's own overhead out of the tail.
            rows.append(uvloop.run(_run(base, n, args.seconds, args.delay)))
    report = {"benchmark": "latency", "model": f"echo:{args.delay}", "phase_groups": args.phase_groups,
              "seconds": args.seconds, "results": rows,
              "note": "server-added latency = receive - send - echo delay; measured by the client on loopback"}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'sessions':>8} {'returned':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
              f"{'late p99 ms':>12} {'server p50/p99 ms':>18} {'missed':>7}")
        for r in rows:
            server = f"{r['server_turnaround_ms_p50']}/{r['server_turnaround_ms_p99']}"
            print(f"{r['sessions']:>8} {r['chunks_returned']:>5}/{r['chunks_expected']:<4} {r['latency_ms_p50']:>8} "
                  f"{r['latency_ms_p99']:>8} {r['latency_ms_max']:>8} {r['tick_lateness_ms_p99']!s:>12} "
                  f"{server:>18} {r['missed_deadlines']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
