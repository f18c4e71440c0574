"""Server-added latency of the WebSocket path, measured by the client, on the echo model.

For each session a client sends a 200 ms PCM16 chunk exactly when a microphone would have it
(at t_start + (k+1) * 200 ms) and waits for the echo to bring those samples back. The server's
added latency is `received - sent - delay * 200 ms`, where `delay` is the echo model's own delay: it
counts the wait for the session's tick, the step and the transport. Sessions start at random phases
within the micro-turn, as real clients do, which is what phase groups exist for.

`--protocol` picks the wire: `realtime` (`/v1/realtime`, binary PCM16 frames in, base64 deltas out)
or `live` (GPT-Live's `/v1/live/sessions`: base64 `session.input_audio.append` in, one
`session.output_audio.delta` per micro-turn out, silence included). A comma list measures each in
one run, alternating per round (`--rounds`, the order reversed every other round) so that what the
machine does meanwhile falls on every protocol alike; each protocol streams `--seconds` in all.

    python -m bench.latency --sessions 1,32 --seconds 20 [--protocol realtime,live] [--phase-groups 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
import time
from contextlib import nullcontext, suppress
from typing import Any

import numpy as np
import uvloop

from bench._server import histogram_quantile, local_server, scrape
from bench.fdbench import live_client
from bench.wsclient import open_session, set_session

TICK = 4800
PERIOD = 0.2
PROTOCOLS = ("realtime", "live")
PATHS = {"realtime": "/v1/realtime", "live": live_client.PATH}
# Server histograms read per protocol: their bucket deltas are summed over that protocol's rounds.
HISTOGRAMS = ("duplex_tick_lateness_seconds", "duplex_tick_turnaround_seconds")


def _wire(protocol: str, chunk: bytes) -> bytes | str:
    """One chunk as `protocol` sends it: a binary frame (Realtime, duplex's binary audio) or a JSON
    `session.input_audio.append` (GPT-Live has no binary frames). Built before the clock starts."""
    if protocol == "live":
        return json.dumps({"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode("ascii")})
    return chunk


async def _session(url: str, seconds: float, delay: int, seed: int, start_at: float,
                   protocol: str = "realtime") -> list[float]:
    rng = np.random.default_rng(seed)
    n = int(seconds / PERIOD)
    chunks = []
    for _ in range(n):
        x = rng.integers(-20000, 20000, TICK).astype("<i2")
        x[x == 0] = 1
        chunks.append(x.tobytes())
    index = {c: k for k, c in enumerate(chunks)}
    frames = [_wire(protocol, c) for c in chunks]
    delta_type = "session.output_audio.delta" if protocol == "live" else "response.output_audio.delta"
    sent: dict[int, float] = {}
    lat: list[float] = []
    async with open_session(url) as ws:
        if protocol == "live":
            await ws.send(live_client.start_message("realtime"))
            await live_client.wait_started(ws)
        else:
            await set_session(ws, pace="realtime")

        all_back = asyncio.Event()

        async def reader() -> None:
            async for msg in ws:
                ev = json.loads(msg)
                if ev["type"] == delta_type:
                    k = index.get(base64.b64decode(ev["delta"]))
                    if k is not None and k in sent:
                        lat.append(time.monotonic() - sent[k] - delay * PERIOD)
                        if len(lat) == n:
                            all_back.set()
                elif ev["type"] == "error":
                    print(f"server error: {ev['error']}", file=sys.stderr)

        task = asyncio.create_task(reader())
        for k, frame in enumerate(frames):
            due = start_at + (k + 1) * PERIOD  # the chunk's last sample exists now
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            sent[k] = time.monotonic()
            await ws.send(frame)
        # The last echoes: done once every chunk is back, else what came within (delay + 2) micro-turns.
        with suppress(TimeoutError):
            await asyncio.wait_for(all_back.wait(), (delay + 2) * PERIOD)
        task.cancel()
        if protocol == "live":  # frees the session now rather than after the resume grace
            await ws.send(json.dumps({"type": "session.close"}))
    return lat


class Tally:
    """One protocol's figures at one session count, summed over its rounds."""

    def __init__(self) -> None:
        self.lat: list[float] = []
        self.expected = 0
        self.metrics: dict[str, float] = {}  # bucket and counter deltas, summed

    def add(self, lat: list[float], expected: int, before: dict[str, float], after: dict[str, float]) -> None:
        self.lat.extend(lat)
        self.expected += expected
        for key, value in after.items():
            if key.startswith(HISTOGRAMS) or key == "duplex_missed_deadlines_total":
                self.metrics[key] = self.metrics.get(key, 0.0) + value - before.get(key, 0.0)


async def _segment(base: str, protocol: str, sessions: int, seconds: float, delay: int, seed: int,
                   tally: Tally) -> None:
    """`sessions` sessions of `protocol` streaming `seconds` each, at once."""
    ws_url = base.replace("http", "ws", 1) + PATHS[protocol]
    before = scrape(base)
    now = time.monotonic() + 0.5
    rnd = random.Random(seed)
    results = await asyncio.gather(*[
        _session(ws_url, seconds, delay, seed=1000 * seed + i, start_at=now + rnd.random() * PERIOD,
                 protocol=protocol)
        for i in range(sessions)])
    after = scrape(base)
    tally.add([x for r in results for x in r], sessions * int(seconds / PERIOD), before, after)


def _row(protocol: str, sessions: int, tally: Tally) -> dict[str, Any]:
    lat = np.array(tally.lat) * 1000
    m = tally.metrics
    lateness = histogram_quantile({}, m, "duplex_tick_lateness_seconds", 0.99)
    missed = m.get("duplex_missed_deadlines_total", 0)
    turnaround = [histogram_quantile({}, m, "duplex_tick_turnaround_seconds", q) for q in (0.5, 0.99)]
    expected = tally.expected
    return {
        "protocol": protocol,
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
    ap.add_argument("--protocol", default="realtime",
                    help="realtime, live, or a comma list (realtime,live) measured alternately in one run")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds each protocol's --seconds is split into, protocols alternating round by round "
                         "(default: 1 for one protocol, 4 for several)")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.sessions.split(",") if x]
    protocols = [x.strip() for x in args.protocol.split(",") if x.strip()]
    unknown = [x for x in protocols if x not in PROTOCOLS]
    if not protocols or unknown or len(set(protocols)) != len(protocols):
        ap.error(f"--protocol takes {' or '.join(PROTOCOLS)}, or both comma-separated, each once; "
                 f"got {args.protocol!r}")
    rounds = args.rounds if args.rounds is not None else (1 if len(protocols) == 1 else 4)
    per_round = args.seconds / max(1, rounds)
    if rounds < 1 or per_round < 2 * PERIOD:
        ap.error(f"--rounds {rounds} leaves {per_round:.2f} s a round; give at least 1 round of 0.4 s (more --seconds)")
    server_args = ["--model", f"echo:{args.delay}", "--max-sessions", str(max(counts) + 8), "--background", "none"]
    if args.phase_groups is not None:
        server_args += ["--phase-groups", str(args.phase_groups)]
    rows: list[dict[str, Any]] = []
    with local_server(*server_args) if args.url is None else nullcontext(args.url) as base:
        for n in counts:
            tallies = {proto: Tally() for proto in protocols}
            for r in range(rounds):
                # ABBA: each protocol goes first as often as the other (a round's start is noisier).
                order = protocols if r % 2 == 0 else protocols[::-1]
                for proto in order:
                    print(f"[bench.latency] {n} session(s), {proto}, round {r + 1}/{rounds}: {per_round:.1f} s ...",
                          file=sys.stderr, flush=True)
                    # uvloop (the server's loop too) keeps the measuring client's own overhead out of the tail.
                    seed = n + 1_000_000 * r  # round 0 keeps the seeds of a one-protocol run
                    uvloop.run(_segment(base, proto, n, per_round, args.delay, seed, tallies[proto]))
            rows.extend(_row(proto, n, tallies[proto]) for proto in protocols)
    report = {"benchmark": "latency", "model": f"echo:{args.delay}", "phase_groups": args.phase_groups,
              "seconds": args.seconds, "protocols": protocols, "rounds": rounds, "results": rows,
              "note": "server-added latency = receive - send - echo delay; measured by the client on loopback"}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_table(rows))
    return 0


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'protocol':>9} {'sessions':>8} {'returned':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
             f"{'late p99 ms':>12} {'server p50/p99 ms':>18} {'missed':>7}"]
    for r in rows:
        server = f"{r['server_turnaround_ms_p50']}/{r['server_turnaround_ms_p99']}"
        lines.append(f"{r['protocol']:>9} {r['sessions']:>8} {r['chunks_returned']:>5}/{r['chunks_expected']:<4} "
                     f"{r['latency_ms_p50']!s:>8} {r['latency_ms_p99']!s:>8} {r['latency_ms_max']!s:>8} "
                     f"{r['tick_lateness_ms_p99']!s:>12} {server:>18} {r['missed_deadlines']:>7}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
