"""python -m bench.engine_scaling: cost of one micro-turn `step` by number of sessions and session age.

    python -m bench.engine_scaling --model native:tiny --sessions 1,4,16 --ages 0,3000 --json
    python -m bench.engine_scaling --model native:tiny --sessions 1,8,16 --deterministic both --peak
    python -m bench.engine_scaling --model native:tiny --device cuda --sessions 1,16,64,256 --no-baseline
    python -m bench.engine_scaling --model cascade --sessions 1,4,8 --json
    python -m bench.engine_scaling --model "moshi:slots={n},threads=2" --checkpoint DIR --sessions 1,2,4,8
    python -m bench.engine_scaling --model "moshi:slots={n}" --checkpoint DIR --device cuda --sessions 1,8,16,32

Generic over any model `models.registry.load_model` knows. It calls the model directly on this thread
(no server, no sockets): what it measures is compute per micro-turn against the 200 ms budget.

Optional model capabilities, used when present and reported as unsupported otherwise:
* `fast_forward(state, turns)`: age a fresh session to `turns` micro-turns cheaply (the native model
  fills its KV store with synthetic keys; see its docstring). Without it only age 0 is measured.
* `baseline_step(batch)`: the cost of a server without persistent sessions, which re-prefills each
  session's whole history every micro-turn. It is measured for ONE session per age (a re-prefill is
  per session, so N sessions cost N times that; the table says "x N, extrapolated").
* `set_deterministic(on)`, `session_bytes`: batch-invariant mode switch; KV bytes per session.

For models that run on torch, every point also counts the FLOPs of one step (matrix products and
attention, as torch's FLOP counter sees them; padding rows included) and reports the achieved rate.
`--peak` measures this machine's dense fp32 matmul rate with the same threads (or the GPU's in bf16)
so the report can say what fraction of it a step reaches, per wall second and per CPU-second. On a
shared machine read the wall times together with `cpu_ms` (process CPU time per step, all threads):
time other processes took the core shows in the first and not the second.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bench._flops import matmul_peak_gflops, step_flops
from bench._reprefill import baseline_step, reprefills
from models.base import Ageing, InteractionModel, TickInput
from models.registry import load_model
from streaming.types import TICK_SAMPLES, TICK_SECONDS

BUDGET_MS = TICK_SECONDS * 1000.0


def progress(msg: str) -> None:
    print(f"[bench.engine_scaling] {msg}", file=sys.stderr, flush=True)


@dataclass
class Point:
    sessions: int
    age: int  # micro-turns each session had lived before the timed steps
    mode: str  # "deterministic", "fast" or "default" (model has no such switch)
    steps: int
    median_ms: float
    p90_ms: float
    per_session_ms: float
    within_budget: bool  # median step <= 200 ms
    cpu_ms: float = 0.0  # median process CPU time per step (all threads; includes OpenMP spinning)
    gflop: float | None = None  # FLOPs of one step, when the model runs on torch
    gflops: float | None = None  # gflop / median wall time
    peak_ratio: float | None = None  # gflops / the measured matmul peak (--peak)
    cpu_gflops: float | None = None  # gflop / median CPU time: the rate per CPU-second (all threads)
    cpu_peak_ratio: float | None = None  # cpu_gflops / the peak per CPU-second (--peak, CPU only)


@dataclass
class Baseline:
    age: int
    ms_one_session: float  # one re-prefill of age+1 micro-turns
    repeats: int


@dataclass
class Report:
    model: str
    device: str
    kv_bytes_per_session: int | None
    max_sessions: int | None
    torch_threads: int | None = None  # intra-op threads, when the model uses torch
    peak_gflops: float | None = None  # dense matmul rate measured on this machine (--peak)
    peak_gflops_cpu: float | None = None  # the same per CPU-second of this process (CPU only)
    load_average: float | None = None  # 1-minute load average at the end: other processes on the CPU
    points: list[Point] = field(default_factory=list)
    baseline: list[Baseline] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sessions_in_budget: dict[str, Any] = field(default_factory=dict)
    age_cost_ratio: dict[str, float] = field(default_factory=dict)  # "mode/sessions" -> oldest / fresh


def _ticks(n: int, seed: int) -> list[TickInput]:
    """Noise at speech level: models do the same work for it as for speech."""
    rng = np.random.default_rng(seed)
    return [TickInput((rng.standard_normal(TICK_SAMPLES) * 0.05).astype(np.float32), TICK_SAMPLES) for _ in range(n)]


@contextlib.contextmanager
def heartbeat(what: str, every_s: float = 30.0) -> Iterator[None]:
    """Print a line every `every_s` seconds while a long measurement runs (a re-prefill of 3000 micro-turns)."""
    done = threading.Event()
    t0 = time.monotonic()

    def beat() -> None:
        while not done.wait(every_s):
            progress(f"  ... {what}: still running after {time.monotonic() - t0:.0f} s")

    t = threading.Thread(target=beat, daemon=True, name="bench-heartbeat")
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()


def _time(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall ms, process CPU ms) of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - t0) * 1000.0, (time.process_time() - c0) * 1000.0


def measure(
    model: InteractionModel,
    sessions: int,
    ages: list[int],
    modes: list[str],
    steps: int,
    warmup: int,
    peak: tuple[float | None, float | None] = (None, None),
) -> list[Point]:
    """Time `sessions` sessions per (age, mode), interleaved step by step.

    Interleaving makes the age and mode comparisons fair on a shared machine: a burst of load from
    another process hits every variant alike instead of whichever happened to run at that moment.
    """
    groups = {age: [model.open(f"bench-{age}-{sessions}-{i}") for i in range(sessions)] for age in ages}
    try:
        for age, states in groups.items():
            for s in states:
                if age:
                    assert isinstance(model, Ageing), "ages > 0 need a model that can fast-forward"
                    model.fast_forward(s, age)
        inputs = [_ticks(warmup + steps + 1, seed=i) for i in range(sessions)]
        times: dict[tuple[int, str], list[tuple[float, float]]] = {(a, m): [] for a in ages for m in modes}
        for k in range(warmup + steps):
            for mode in modes:
                if mode != "default":
                    model.set_deterministic(mode == "deterministic")  # type: ignore[attr-defined]
                for age, states in groups.items():
                    batch = [(s, inputs[i][k]) for i, s in enumerate(states)]
                    ms = _time(lambda batch=batch: model.step(batch))  # type: ignore[misc]
                    if k >= warmup:
                        times[(age, mode)].append(ms)
        flops: dict[tuple[int, str], float | None] = {}
        for mode in modes:  # one more step per point, untimed, under the FLOP counter
            if mode != "default":
                model.set_deterministic(mode == "deterministic")  # type: ignore[attr-defined]
            for age, states in groups.items():
                batch = [(s, inputs[i][-1]) for i, s in enumerate(states)]
                flops[(age, mode)] = step_flops(lambda batch=batch: model.step(batch))  # type: ignore[misc]
    finally:
        for states in groups.values():
            for s in states:
                model.close(s)
    points = []
    for (age, mode), ts in times.items():
        wall = [w for w, _ in ts]
        med = statistics.median(wall)
        p90 = sorted(wall)[max(0, round(0.9 * len(wall)) - 1)]
        f = flops[(age, mode)]
        gf = round(f / 1e9, 3) if f is not None else None
        rate = round(f / 1e6 / med, 2) if f is not None and med > 0 else None
        cpu = statistics.median(c for _, c in ts)
        ratio = round(rate / peak[0], 3) if rate is not None and peak[0] else None
        cpu_rate = round(f / 1e6 / cpu, 2) if f is not None and cpu > 0 else None
        cpu_ratio = round(cpu_rate / peak[1], 3) if cpu_rate is not None and peak[1] else None
        points.append(
            Point(sessions, age, mode, steps, round(med, 2), round(p90, 2), round(med / sessions, 2), med <= BUDGET_MS,
                  round(cpu, 2), gf, rate, ratio, cpu_rate, cpu_ratio)
        )
    return points


def measure_baseline(model: InteractionModel, age: int, repeats: int) -> Baseline:
    state = model.open(f"bench-baseline-{age}")
    try:
        if age:
            assert isinstance(model, Ageing), "ages > 0 need a model that can fast-forward"
            model.fast_forward(state, age)
        tick = _ticks(1, seed=99)[0]
        with heartbeat(f"re-prefill of {age + 1} micro-turns"):
            times = [_time(lambda: baseline_step(model, [(state, tick)]))[0] for _ in range(repeats)]  # type: ignore[arg-type]
    finally:
        model.close(state)
    return Baseline(age, round(statistics.median(times), 1), repeats)


def _load(args: argparse.Namespace, sessions: int) -> InteractionModel:
    """`--model` may hold `{n}` (moshi:slots={n}): then a model is built for each point, with n its
    number of sessions. A model with fixed slots computes every slot each step, whoever is live."""
    name = args.model.replace("{n}", str(sessions))
    progress(f"loading {name} ...")
    return load_model(name, checkpoint=args.checkpoint, device=args.device)


def run(args: argparse.Namespace) -> Report:
    per_point = "{n}" in args.model
    model = _load(args, args.sessions[0])
    can_age, can_baseline = isinstance(model, Ageing), reprefills(model)
    report = Report(
        args.model, str(getattr(model, "device", "cpu")), getattr(model, "session_bytes", None), model.max_sessions
    )
    ages = args.ages
    if not can_age and any(a > 0 for a in ages):
        report.notes.append(f"{args.model} has no fast_forward: ages > 0 not supported, only age 0 measured")
        ages = [0]
    if not can_baseline:
        report.notes.append(f"{args.model} has no baseline_step: no re-prefill baseline for it")
    if args.peak:
        progress("measuring this machine's matmul peak ...")
        report.peak_gflops, report.peak_gflops_cpu = matmul_peak_gflops(str(getattr(model, "device", "cpu")))
        per_cpu = f", {report.peak_gflops_cpu:.1f} per CPU-second" if report.peak_gflops_cpu else ""
        progress(f"  {report.peak_gflops:.1f} GFLOP/s{per_cpu}")
    modes = ["default"]
    if hasattr(model, "set_deterministic"):
        modes = {"on": ["deterministic"], "off": ["fast"], "both": ["deterministic", "fast"]}[args.deterministic]
    if per_point:
        report.notes.append(f"model rebuilt for each point: {args.model} with n = its sessions x ages")
    for n in args.sessions:
        need = n * len(ages)
        if per_point and model.max_sessions != need:
            model = _load(args, need)
        if model.max_sessions is not None and need > model.max_sessions:
            report.notes.append(
                f"{n} sessions x {len(ages)} ages exceed the model's {model.max_sessions} slots: skipped"
            )
            continue
        progress(f"{n} session(s), ages {ages}, modes {modes}: {args.warmup} warm-up + {args.steps} timed steps")
        peaks = (report.peak_gflops, report.peak_gflops_cpu)
        for p in measure(model, n, ages, modes, args.steps, args.warmup, peaks):
            rate = f", {p.gflops:.1f} GFLOP/s" if p.gflops is not None else ""
            progress(
                f"  {p.mode} age {p.age}: median {p.median_ms:.1f} ms/step (CPU {p.cpu_ms:.1f} ms), "
                f"{p.per_session_ms:.1f} ms/session{rate}, "
                f"{'within' if p.within_budget else 'OVER'} the {BUDGET_MS:.0f} ms budget"
            )
            report.points.append(p)
    if can_baseline and not args.no_baseline:
        for age in ages:
            reps = 3 if age < 500 else 1
            progress(f"baseline: re-prefill {age + 1} micro-turns for one session ({reps} repeat(s)) ...")
            b = measure_baseline(model, age, reps)
            progress(f"  {b.ms_one_session:.1f} ms per micro-turn per session")
            report.baseline.append(b)
    summarise(report)
    if "torch" in sys.modules:
        report.torch_threads = sys.modules["torch"].get_num_threads()
    report.load_average = round(os.getloadavg()[0], 2)
    return report


def summarise(r: Report) -> None:
    for mode in {p.mode for p in r.points}:
        pts = [p for p in r.points if p.mode == mode]
        for age in sorted({p.age for p in pts}):
            at = [p for p in pts if p.age == age]
            inside = [p.sessions for p in at if p.within_budget]
            best = min(at, key=lambda p: p.per_session_ms)
            r.sessions_in_budget[f"{mode}/age{age}"] = {
                "measured_max": max(inside) if inside else 0,
                "estimated": int(BUDGET_MS // best.per_session_ms) if best.per_session_ms > 0 else None,
            }
        ages = sorted({p.age for p in pts})
        if len(ages) > 1:
            for n in sorted({p.sessions for p in pts}):
                by_age = {p.age: p.median_ms for p in pts if p.sessions == n}
                if ages[0] in by_age and ages[-1] in by_age:
                    r.age_cost_ratio[f"{mode}/{n}"] = round(by_age[ages[-1]] / by_age[ages[0]], 3)


def table(r: Report) -> str:
    peak = f"; matmul peak {r.peak_gflops:.1f} GFLOP/s" if r.peak_gflops else ""
    if r.peak_gflops_cpu:
        peak += f" ({r.peak_gflops_cpu:.1f} per CPU-second)"
    lines = [
        f"model {r.model} on {r.device}; KV bytes/session: {r.kv_bytes_per_session}; "
        f"KV slots: {r.max_sessions}; budget {BUDGET_MS:.0f} ms per micro-turn; torch threads "
        f"{r.torch_threads}; load average {r.load_average}{peak}",
        f"{'mode':<14}{'sessions':>9}{'age':>7}{'median ms':>11}{'p90 ms':>9}{'cpu ms':>9}{'ms/session':>12}"
        f"{'GFLOP/s':>9}{'of peak':>9}{'per cpu-s':>10}{'of peak':>9}{'re-prefill ms':>15}  budget",
    ]
    base = {b.age: b.ms_one_session for b in r.baseline}
    for p in r.points:
        b = f"{base[p.age] * p.sessions:.0f}" + ("*" if p.sessions > 1 else "") if p.age in base else "-"
        rate = f"{p.gflops:.1f}" if p.gflops is not None else "-"
        ratio = f"{p.peak_ratio:.0%}" if p.peak_ratio is not None else "-"
        cpu_rate = f"{p.cpu_gflops:.1f}" if p.cpu_gflops is not None else "-"
        cpu_ratio = f"{p.cpu_peak_ratio:.0%}" if p.cpu_peak_ratio is not None else "-"
        lines.append(
            f"{p.mode:<14}{p.sessions:>9}{p.age:>7}{p.median_ms:>11.1f}{p.p90_ms:>9.1f}{p.cpu_ms:>9.1f}"
            f"{p.per_session_ms:>12.1f}{rate:>9}{ratio:>9}{cpu_rate:>10}{cpu_ratio:>9}{b:>15}  "
            f"{'ok' if p.within_budget else 'OVER'}"
        )
    if r.baseline:
        lines.append("* re-prefill measured for one session, x N sessions extrapolated")
    lines += [
        f"sessions inside the budget: {json.dumps(r.sessions_in_budget)}",
        f"cost ratio oldest/fresh age: {json.dumps(r.age_cost_ratio)}",
        *[f"note: {n}" for n in r.notes],
    ]
    return "\n".join(lines)


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want comma-separated integers like 1,4,16; got {s!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine_scaling", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="native:tiny")
    ap.add_argument("--checkpoint")
    ap.add_argument("--device", help="cpu or cuda (default: the model's choice)")
    ap.add_argument("--sessions", type=_ints, default=[1, 4, 16])
    ap.add_argument("--ages", type=_ints, default=[0], help="micro-turns each session has lived (3000 = 10 min)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per point")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--deterministic",
        choices=["on", "off", "both"],
        default="on",
        help="for models with a batch-invariant mode: which mode(s) to measure",
    )
    ap.add_argument("--no-baseline", action="store_true", help="skip the re-prefill baseline")
    ap.add_argument("--peak", action="store_true", help="measure the matmul peak and report steps as a fraction of it")
    ap.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    args = ap.parse_args(argv)
    bad = args.steps < 1 or args.warmup < 0 or not args.sessions or min(args.sessions) < 1
    if bad or min(args.ages, default=0) < 0:
        ap.error("--steps >= 1, --warmup >= 0, --sessions >= 1 and --ages >= 0 are required")
    report = run(args)
    print(table(report), file=sys.stderr)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
