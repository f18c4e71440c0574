"""Training-step throughput of the native model on this machine, against its measured matmul peak.

    python -m bench.native.train_throughput --json            # tiny, 1 episode of 50 micro-turns, bf16 and fp32
    python -m bench.native.train_throughput --ticks 100 --batch 2 --precision auto   # what `duplex train` runs

Reports, per precision: tokens/s of one optimiser step (forward_batched + losses + backward + AdamW),
its FLOPs (counted by torch.utils.flop_counter: matmuls and attention, forward and backward), the
achieved GFLOP/s, and that as a fraction of this machine's measured fp32 (and bf16) matmul peak
(best of a few 2048^3 products on the same threads). Also the speedup of the batched training path
over the per-micro-turn loop (forward_sequence, which runs the model tile by tile like streaming),
fp32 forward+backward of one episode of --loop-ticks micro-turns (default: the --ticks trained on),
and the training step of the precision `auto` picks (train.client.resolve_precision) against that
loop in tokens/s. Numbers on a shared machine are noisy: compare runs made in the same conditions.
"""

import argparse
import json
import time
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from models.interaction.config import FRAMES_PER_TICK, NO_BYTE, preset
from models.interaction.model import TickFeatures
from models.interaction.video import PATCH
from train.client import AdamParams, TrainingClient, resolve_precision
from train.losses import Batch
from train.memory import keep_freed_memory


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 3) -> float:
    """Best GFLOP/s of an n^3 matmul in `dtype` on the current threads."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def synthetic_batch(preset_name: str, batch: int, ticks: int, seed: int = 0) -> Batch:
    """Random inputs and labels of the real shapes (throughput does not depend on their values)."""
    cfg = preset(preset_name)
    g = torch.Generator().manual_seed(seed)
    rows = batch * ticks

    def ints(hi: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, hi, shape, generator=g)

    feats = TickFeatures(
        user_dmel=ints(cfg.dmel_levels, rows, FRAMES_PER_TICK, cfg.dmel_bins),
        self_dmel=ints(cfg.dmel_levels, rows, FRAMES_PER_TICK, cfg.dmel_bins),
        video=torch.zeros(rows, cfg.video_grid**2, PATCH, PATCH, 3),
        video_present=torch.zeros(rows, dtype=torch.bool),
        typed=torch.full((rows, cfg.typed_tokens), NO_BYTE),
        background=torch.full((rows, cfg.background_tokens), NO_BYTE),
        own_text=ints(257, rows, cfg.text_tokens),
    )
    return Batch(
        feats=feats, n_ticks=ticks, control=ints(5, rows), user_speaking=ints(2, rows).float(),
        text=ints(257, rows, cfg.text_tokens), transcript=ints(257, rows, cfg.transcript_tokens),
        mel=torch.randn(rows, FRAMES_PER_TICK, cfg.mel_bins, generator=g), mel_mask=ints(2, rows).bool(),
    )


def step_figures(preset_name: str, batch: Batch, precision: str, steps: int) -> dict[str, Any]:
    tc = TrainingClient(preset_name, precision=precision)
    adam = AdamParams()
    with FlopCounterMode(display=False) as fc:
        tc.forward_backward(batch)
    tc.optim_step(adam)  # that was the warm-up step too
    flops = fc.get_total_flops()
    times = []
    for i in range(steps):
        t = time.perf_counter()
        fb = tc.forward_backward(batch)
        tc.optim_step(adam)
        times.append(time.perf_counter() - t)
        print(f"  {precision} step {i + 1}/{steps}: {times[-1]:.2f} s, loss {fb.loss:.3f}", flush=True)
    best = min(times)
    tokens = batch.rows * tc.net.cfg.tokens_per_tick
    return {"tokens_per_step": tokens, "step_s": round(best, 3), "tokens_per_s": round(tokens / best, 1),
            "gflop_per_step": round(flops / 1e9, 2), "gflops": round(flops / best / 1e9, 2)}


def loop_speedup(preset_name: str, ticks: int, reps: int) -> dict[str, float]:
    """fp32 forward+backward of one episode: batched path vs the per-micro-turn (tile) loop.

    Each path is run once untimed first (its first call pays allocations and mask building), then
    `reps` times alternating with the other, best kept: on a shared machine alternating keeps a burst
    of someone else's load from landing on one path only.
    """
    tc = TrainingClient(preset_name, precision="fp32")
    b = synthetic_batch(preset_name, 1, ticks, seed=1)
    paths = (("batched_s", lambda: tc.net.forward_batched(b.feats, ticks)),
             ("per_turn_loop_s", lambda: tc.net.forward_sequence(b.feats)))
    out: dict[str, float] = {}
    for rep in range(reps + 1):
        for name, fn in paths:
            t = time.perf_counter()
            h = fn()
            (h.control.float().square().mean() + h.audio_cond.float().square().mean()).backward()
            dt = time.perf_counter() - t
            tc.net.zero_grad(set_to_none=True)
            label = "warm-up" if rep == 0 else f"{rep}/{reps}"
            print(f"  {name} {label}: {dt:.2f} s", flush=True)
            if rep:
                out[name] = round(min(out.get(name, dt), dt), 3)
    out["speedup"] = round(out["per_turn_loop_s"] / out["batched_s"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--ticks", "--turns", type=int, default=50, help="micro-turns per episode")
    ap.add_argument("--batch", type=int, default=1, help="episodes per step")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per precision (best is reported)")
    ap.add_argument("--precision", default="bf16,fp32", help="comma-separated: bf16, fp32, auto")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = all this process may use)")
    ap.add_argument("--loop-ticks", "--loop-turns", type=int, default=-1,
                    help="episode length of the loop comparison (-1 = --ticks, 0 = skip)")
    ap.add_argument("--loop-reps", type=int, default=2, help="timed runs of each path in the loop comparison")
    ap.add_argument("--malloc-default", action="store_true",
                    help="leave glibc's large allocations to mmap (what train/memory.py changes; to measure it)")
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    # What `duplex train` does (train/memory.py); the loop comparison runs in this same process.
    heap_kept = False if a.malloc_default else keep_freed_memory()
    auto = resolve_precision("auto", torch.device("cpu"))
    precisions = [auto if p == "auto" else p for p in a.precision.split(",")]
    print(f"measuring matmul peaks on {torch.get_num_threads()} threads", flush=True)
    # The JSON keys ("turns", "per_turn_loop_s") stay as results already saved name them.
    result: dict[str, Any] = {"preset": a.preset, "threads": torch.get_num_threads(), "turns": a.ticks,
                              "batch": a.batch, "auto_precision": auto, "heap_kept": heap_kept}
    peaks = {"fp32": matmul_peak(torch.float32)}
    result["fp32_matmul_peak_gflops"] = round(peaks["fp32"], 1)
    # Only where a step runs in bf16: without bf16 arithmetic (AVX2) one 2048^3 bf16 product takes minutes.
    if "bf16" in precisions:
        peaks["bf16"] = matmul_peak(torch.bfloat16)
        result["bf16_matmul_peak_gflops"] = round(peaks["bf16"], 1)
    batch = synthetic_batch(a.preset, a.batch, a.ticks)
    for name, prec in zip(a.precision.split(","), precisions, strict=True):
        r = step_figures(a.preset, batch, prec, a.steps)
        r["precision"] = prec
        for k, peak in peaks.items():
            r[f"fraction_of_{k}_peak"] = round(r["gflops"] / peak, 3)
        result[name] = r
    loop_ticks = a.ticks if a.loop_ticks < 0 else a.loop_ticks
    if loop_ticks:
        vs = loop_speedup(a.preset, loop_ticks, max(a.loop_reps, 1))
        loop_tps = loop_ticks * preset(a.preset).tokens_per_tick / vs["per_turn_loop_s"]
        vs["loop_tokens_per_s"] = round(loop_tps, 1)
        step = result.get("auto") or result.get(auto)
        if step:  # the whole training step (losses and AdamW included) against the loop's forward+backward
            vs["train_step_vs_loop"] = round(step["tokens_per_s"] / loop_tps, 2)
        result["batched_vs_loop"] = vs
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
