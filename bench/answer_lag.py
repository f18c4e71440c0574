"""How long each delegated question waited for its answer's first audio, from a `bench.fdbench run` folder.

TOR at several sessions moves from run to run by as much as any change, because a sample is decided by
whether the answer starts before its clip ends. The lag itself is the quantity a change to the reasoner
or the synthesis moves: from the micro-turn the question was delegated (the `delegate` event the runner
logs in `output.events.json`) to the first audio of the answer, the first
`response.output_audio_transcript.delta` after it (a phrase started playing; the acknowledgment's starts
at or before the delegate's micro-turn). A fast answer plays on in the acknowledgment's response, so the
next `response.created` is not its start; logs written before the runner kept the deltas
fall back to it. A question whose answer never started before the clip ended counts as not answered,
and the percentiles take it as longer than every answered one.

    python -m bench.answer_lag RUN_DIR [RUN_DIR ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVENTS = "output.events.json"


@dataclass
class Lags:
    """One run's answer lags (seconds; `math.inf` for a question the clip ended before answering)."""

    run: str
    lags: list[float]

    @property
    def unanswered(self) -> int:
        return sum(1 for x in self.lags if math.isinf(x))

    def quantile(self, q: float) -> float | None:
        """The `q` quantile (nearest rank); inf when it falls among the unanswered; None without questions."""
        if not self.lags:
            return None
        ordered = sorted(self.lags)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


SPOKEN = "response.output_audio_transcript.delta"


def sample_lags(events: list[dict[str, Any]]) -> list[float]:
    """Every delegated question's lag in one sample's event log."""
    lags: list[float] = []
    asked: float | None = None
    start = SPOKEN if any(e.get("type") == SPOKEN for e in events) else "response.created"
    for e in events:
        kind, t = e.get("type"), e.get("t")
        if not isinstance(t, (int, float)):
            continue
        if kind == "duplex.event" and e.get("text") == "delegate":
            if asked is not None:
                lags.append(math.inf)  # asked again before the first answer started
            asked = float(t)
        elif kind == start and asked is not None and t > asked:
            lags.append(float(t) - asked)
            asked = None
    if asked is not None:
        lags.append(math.inf)
    return lags


def run_lags(run: Path, tasks: tuple[str, ...] = ("turn_taking", "interruption")) -> Lags:
    """The lags of every sample of `run` whose task folder names one of `tasks`."""
    files = sorted(run.glob(f"*/*/{EVENTS}"))
    if not files:
        raise SystemExit(f"{run}: no */*/{EVENTS}; give the folder `python -m bench.fdbench run --data` wrote")
    lags: list[float] = []
    for f in files:
        if not any(t in f.parent.parent.name for t in tasks):
            continue
        try:
            events = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise SystemExit(f"{f}: unreadable event log ({e}); run the sample again") from e
        if not isinstance(events, list):
            raise SystemExit(f"{f}: expected a list of events, got {type(events).__name__}")
        lags += sample_lags(events)
    return Lags(str(run), lags)


def _fmt(x: float | None) -> str:
    return "-" if x is None else "never" if math.isinf(x) else f"{x:.2f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.answer_lag", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="folders written by `bench.fdbench run`")
    ap.add_argument("--json", action="store_true", help="one JSON object per run instead of a line")
    args = ap.parse_args(argv)
    for run in args.runs:
        r = run_lags(run)
        p50, p90 = r.quantile(0.5), r.quantile(0.9)
        if args.json:
            print(json.dumps({"run": r.run, "questions": len(r.lags), "unanswered": r.unanswered,
                              "p50": None if p50 is None or math.isinf(p50) else p50,
                              "p90": None if p90 is None or math.isinf(p90) else p90}))
        else:
            print(f"{r.run}: {len(r.lags)} questions, delegate -> answer p50 {_fmt(p50)}, p90 {_fmt(p90)}, "
                  f"{r.unanswered} unanswered before the clip ended")
    return 0


if __name__ == "__main__":
    sys.exit(main())
