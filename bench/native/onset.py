"""Calibrate the p(speak) a native checkpoint needs to take the floor (models/interaction/onset.py).

    python -m bench.fdbench generate --out data/onset-tune --seed 5151   # a tuning set, not your test set
    python -m bench.native.onset --data data/onset-tune --jobs 2         # the table, the chosen threshold
    python -m bench.native.onset --data data/onset-tune --write          # ... recorded in the checkpoint

Every mid-sentence pause, turn-taking and interruption sample of an FD-bench-layout set is stepped in
process through the checkpoint, closed loop (the micro-turns the server steps at media pace: Piper
speaks its text and it hears that back, one torch thread), once per threshold of `--thresholds`.
From when it speaks, per sample:

* pause: taken when it starts speaking early enough to be heard for a second before the sample ends
  (a take-over, as FD-bench scores one);
* turn-taking: answered when it speaks at all; latency: its first speaking micro-turn's output time
  minus the end of the question, floored at 0 (FD-bench times the first word, which comes a little later);
* interruption: answered when it speaks for a second or more after the interruption ends (FD-bench's
  reply after an interruption); latency from that end.

Chosen: the lowest threshold that takes the floor in at most `--max-pause-rate` of the pauses (0.3,
the project's floor on FD-bench's pause TOR): every higher one only answers fewer questions, later.
J = (turns answered + interruptions answered) / 2 - pauses taken is printed beside each, for another
trade-off. Calibrate on a set you do not report figures on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.fdbench.layout import Sample, find_samples, interruption_span, turn_end
from bench.fdbench.metrics import TURN_DURATION_S  # a take-over lasts this long (or has > 3 words)
from models.interaction.onset import ONSET_KEY, ONSET_NOTE_KEY
from models.interaction.options import TURN_CHECK_MODES, check_onset
from streaming.types import TICK_SECONDS

THRESHOLDS = (0.0, 0.5, 0.55, 0.6, 0.65, 0.7)  # 0 = greedy
KINDS = ("pause", "turn_taking", "interruption")
MAX_PAUSE = 0.3  # default bound on the pauses taken (the project's floor for FD-bench's pause TOR)


@dataclass
class Run:
    sample: str
    kind: str
    seconds: float  # the sample's duration
    ref: float  # turn_taking: the question's end; interruption: the interruption's end; pause: unused
    speaking: list[bool]  # per micro-turn: the model spoke (its output is heard from (k + 1) * 0.2 s)


def _reference(s: Sample) -> float:
    """What latency is timed from: the question's end, the interruption's end (pauses: none)."""
    if s.kind == "turn_taking":
        return turn_end(s)
    return interruption_span(s)[1] if s.kind == "interruption" else 0.0


def _runs(args: tuple[list[Sample], float, str | None, str]) -> list[Run]:
    """Every sample, closed loop, under one threshold (one process: one model, one Piper talker)."""
    import torch

    from models.base import TickInput, wait_work
    from models.interaction import load_native
    from models.interaction.options import NativeOptions
    from streaming.resample import resample
    from streaming.types import SAMPLE_RATE, TICK_SAMPLES
    from streaming.wav import read_wav

    samples, threshold, checkpoint, turn_check = args
    torch.set_num_threads(1)
    model = load_native("tiny", checkpoint, device="cpu",
                        options=NativeOptions(threads=1, kv_budget_mb=64, voice="piper", onset=threshold,
                                              query="heard", turn_check=turn_check))
    out = []
    try:
        for i, s in enumerate(samples):
            audio, rate = read_wav(s.file("input.wav"))
            audio = resample(audio, rate, SAMPLE_RATE)
            n = -(-len(audio) // TICK_SAMPLES)
            audio = np.pad(audio, (0, n * TICK_SAMPLES - len(audio))).astype(np.float32)
            st = model.open(f"onset-{s.name}")
            spoke = []
            try:
                for k in range(n):
                    wait_work(model, [st], 60.0)  # as the media-pace engine: the talker's due synthesis
                    model.step([(st, TickInput(audio[k * TICK_SAMPLES : (k + 1) * TICK_SAMPLES], TICK_SAMPLES))])
                    spoke.append(st.speaking)
            finally:
                model.close(st)
            out.append(Run(s.name, s.kind, len(audio) / SAMPLE_RATE, _reference(s), spoke))
            print(f"native_onset: threshold {threshold:.2f}: {i + 1}/{len(samples)} {s.name}", file=sys.stderr,
                  flush=True)
    finally:
        model.shutdown()
    return out


def _spans(spoke: list[bool]) -> list[tuple[float, float]]:
    """[start, end) output times of each run of speaking micro-turns."""
    spans, start = [], None
    for k, s in enumerate([*spoke, False]):
        if s and start is None:
            start = k
        elif not s and start is not None:
            spans.append(((start + 1) * TICK_SECONDS, (k + 1) * TICK_SECONDS))
            start = None
    return spans


def judge(r: Run) -> tuple[bool, float | None]:
    """(took the floor / answered, latency in s or None) of one sample's run."""
    spans = _spans(r.speaking)
    if r.kind == "pause":
        return any(a <= r.seconds - TURN_DURATION_S for a, _ in spans), None
    if r.kind == "turn_taking":
        return (True, max(0.0, spans[0][0] - r.ref)) if spans else (False, None)
    after = [(max(a, r.ref), z) for a, z in spans if z > r.ref and z - max(a, r.ref) >= TURN_DURATION_S]
    return (True, after[0][0] - r.ref) if after else (False, None)


def summarise(threshold: float, runs: list[Run]) -> dict[str, Any]:
    row: dict[str, Any] = {"threshold": threshold}
    rates = {}
    for kind in KINDS:
        got = [judge(r) for r in runs if r.kind == kind]
        lat = [x for ok, x in got if ok and x is not None]
        rates[kind] = sum(ok for ok, _ in got) / len(got) if got else 0.0
        row[kind] = {"n": len(got), "rate": round(rates[kind], 3)}
        if kind != "pause":
            row[kind]["latency_mean"] = round(statistics.fmean(lat), 3) if lat else None
    row["j"] = round((rates["turn_taking"] + rates["interruption"]) / 2 - rates["pause"], 3)
    return row


def choose(rows: list[dict[str, Any]], max_pause: float = MAX_PAUSE) -> dict[str, Any]:
    """The lowest threshold that takes the floor in at most `max_pause` of the pauses (the fastest that
    keeps the pause rate in bounds); where none does, the one taking the fewest (the lowest of equals)."""
    ok = [r for r in rows if r["pause"]["rate"] <= max_pause]
    if ok:
        return min(ok, key=lambda r: r["threshold"])
    return min(rows, key=lambda r: (r["pause"]["rate"], r["threshold"]))


def sweep(data: Path, thresholds: tuple[float, ...], checkpoint: str | None, jobs: int,
          limit: int | None = None, turn_check: str = "auto") -> list[dict[str, Any]]:
    samples = [s for s in find_samples(data) if s.kind in KINDS]
    if limit:
        samples = [s for kind in KINDS for s in [x for x in samples if x.kind == kind][:limit]]
    if not samples:
        raise SystemExit(f"{data} holds no pause, turn-taking or interruption samples; make a set with "
                         "`python -m bench.fdbench generate --out DIR --seed N`")
    work = [(samples, th, checkpoint, turn_check) for th in thresholds]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_runs, work))
    else:
        results = [_runs(w) for w in work]
    return [summarise(th, runs) for th, runs in zip(thresholds, results, strict=True)]


def write(checkpoint: Path, chosen: dict[str, Any], data: Path, max_pause: float = MAX_PAUSE) -> None:
    from models.interaction.checkpoint import update_metadata

    figures = ", ".join(f"{k} {chosen[k]['rate']}" for k in KINDS)
    note = (f"bench.native.onset on {data.name} (closed loop; the lowest threshold taking at most {max_pause} of "
            f"the pauses; rates of pauses taken, turns and interruptions answered): {figures} "
            f"({time.strftime('%Y-%m-%d')})")
    update_metadata(checkpoint, {ONSET_KEY: f"{chosen['threshold']:.2f}", ONSET_NOTE_KEY: note})


def _table(rows: list[dict[str, Any]], chosen: dict[str, Any]) -> str:
    lines = ["threshold  pauses taken  turns answered (latency s)  interruptions answered (latency s)  J"]
    for r in rows:
        name = "greedy" if r["threshold"] == 0 else f"{r['threshold']:.2f}"
        t, i = r["turn_taking"], r["interruption"]
        lines.append(f"{name:>9}  {r['pause']['rate']:>12.2f}  {t['rate']:>14.2f} ({t['latency_mean']})"
                     f"  {i['rate']:>22.2f} ({i['latency_mean']})  {r['j']:+.2f}"
                     + ("  <- chosen" if r is chosen else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="an FD-bench-layout set (bench.fdbench generate)")
    ap.add_argument("--checkpoint", default=None, help="native:tiny checkpoint (default: the shipped one)")
    ap.add_argument("--thresholds", default=",".join(str(t) for t in THRESHOLDS),
                    help="comma-separated p(speak) values to try; 0 = greedy (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=1, help="thresholds run in parallel processes (one core each)")
    ap.add_argument("--max-pause-rate", type=float, default=MAX_PAUSE,
                    help="choose the lowest threshold taking the floor in at most this share of the pauses "
                    "(default: %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many samples per task (a quick look)")
    ap.add_argument("--write", action="store_true", help="record the chosen threshold in the checkpoint's metadata")
    ap.add_argument("--turn-check", choices=TURN_CHECK_MODES, default="auto",
                    help="the words' verdict on onsets, as `duplex serve --native-turn-check` (default: %(default)s, "
                    "as served)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args(argv)
    try:
        thresholds = tuple(check_onset(float(x)) for x in a.thresholds.split(","))
    except ValueError:
        raise SystemExit(f"--thresholds {a.thresholds!r}: comma-separated probabilities in [0, 1), e.g. 0,0.5,0.6; "
                         "0 = greedy") from None
    rows = sweep(a.data, thresholds, a.checkpoint, max(1, a.jobs), a.limit, a.turn_check)
    chosen = choose(rows, a.max_pause_rate)
    if a.write:
        from models.interaction.checkpoint import shipped_checkpoint

        path = Path(a.checkpoint) if a.checkpoint else shipped_checkpoint("tiny")
        if path is None:
            raise SystemExit("no checkpoint to write to: pass --checkpoint FILE")
        write(path, chosen, a.data, a.max_pause_rate)
        print(f"wrote {ONSET_KEY}={chosen['threshold']:.2f} into {path}", file=sys.stderr)
    if a.json:
        print(json.dumps({"rows": rows, "chosen": chosen["threshold"], "max_pause_rate": a.max_pause_rate}))
    else:
        print(_table(rows, chosen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
