"""How fast a native session is rebuilt from its micro-turn log .

    python -m bench.native.replay [--model native:tiny] [--ticks 150] [--json]

A session of `--model` lives `--ticks` micro-turns (PCM16-exact noise at speech level, a typed line and
a background answer along the way) with its log kept; the log goes through bytes, as through the
session store, and is replayed into a fresh session of the same id, every output checked against its
digest (models/interaction/replay.py). Reported: the live step rate, the replay rate in micro-turns
per second and as a multiple of real time (5 micro-turns a second), the log's bytes per micro-turn,
and whether the rebuilt KV row equals the live one bit for bit.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from models.base import BackgroundChunk, TickInput
from models.interaction import NativeModel
from models.interaction.options import NativeOptions
from models.interaction.replay import TickLog, replay
from models.registry import load_model
from streaming.types import TICK_SAMPLES, TICK_SECONDS


def _inputs(n: int, seed: int = 0) -> list[TickInput]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        pcm = (rng.standard_normal(TICK_SAMPLES) * 3000).clip(-32768, 32767).astype(np.int16)
        out.append(TickInput(pcm.astype(np.float32) / np.float32(32768), TICK_SAMPLES,
                             text=["what time is it?"] if i == 10 else [],
                             background=[BackgroundChunk("bg_1", 1, "It is noon.", done=True)] if i == 40 else []))
    return out


def measure(model_name: str, ticks: int) -> dict[str, float | int | bool]:
    model = load_model(model_name, native=NativeOptions(deterministic=True))
    assert isinstance(model, NativeModel), f"{model_name} is not the native model"
    inputs = _inputs(ticks)
    live = model.open("sess_bench")
    live.log = TickLog(max_ticks=ticks)
    model.step([(live, inputs[0])])  # warm-up is part of the log: the replay pays it too
    started = time.perf_counter()
    for i, t in enumerate(inputs[1:], 1):
        model.step([(live, t)])
        if i % 50 == 0:
            print(f"  lived {i}/{ticks} micro-turns", flush=True)
    live_s = time.perf_counter() - started
    data = live.log.to_bytes()
    rebuilt = model.open("sess_bench")
    started = time.perf_counter()
    replay(model, rebuilt, TickLog.from_bytes(data), progress=lambda d, n: print(f"  replayed {d}/{n}", flush=True))
    replay_s = time.perf_counter() - started
    pool = model.pool
    identical = all(torch.equal(x[live.slot], x[rebuilt.slot]) for x in [*pool.k, *pool.v, pool.conv])
    rate = ticks / replay_s
    return {"ticks": ticks, "live_ticks_per_s": (ticks - 1) / live_s, "replay_ticks_per_s": rate,
            "replay_x_realtime": rate * TICK_SECONDS, "replay_s": replay_s, "log_bytes_per_tick": len(data) / ticks,
            "kv_identical": identical, "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="native:tiny")
    parser.add_argument("--ticks", type=int, default=150, help="micro-turns the session lives before it moves")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(f"{args.model}: living {args.ticks} micro-turns, then replaying them ...", flush=True)
    r = measure(args.model, args.ticks)
    print(f"replay of {r['ticks']} micro-turns: {r['replay_ticks_per_s']:.1f} micro-turns/s = "
          f"{r['replay_x_realtime']:.1f}x real time ({r['replay_s']:.2f} s; live stepping "
          f"{r['live_ticks_per_s']:.1f}/s); log {r['log_bytes_per_tick']:.0f} B per micro-turn; "
          f"KV bit-identical: {r['kv_identical']} ({r['threads']} torch threads)")
    if args.json:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
