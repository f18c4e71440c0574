"""python -m bench.fdbench {generate,run,score,report}: a Full-Duplex-Bench v1.0 / v1.5 compatible harness.

generate --out DIR                 synthetic set in the official layout (offline TTS, seeded)
run --data DIR --url ws://...      stream every input through the server, write output.wav
                                   (--protocol live: through /v1/live/sessions)
score --data DIR [--data DIR2]     offline ASR + official metrics; a table, or --json
report DIR [DIR2 ...] --html OUT   the same, as one self-contained page with a timeline per sample
"""

import argparse
import json
import sys
from pathlib import Path

from bench.fdbench.layout import GENERATED_V1_TASKS, V15_TASKS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.fdbench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="write a synthetic set in the official layout")
    g.add_argument("--out", type=Path, required=True, help="folder to write (created)")
    g.add_argument("--samples", type=int, default=20, help="samples per v1.0 task (default 20)")
    g.add_argument("--v15-samples", type=int, default=5, help="samples per v1.5 overlap subset (default 5)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tasks", nargs="+", choices=[*GENERATED_V1_TASKS, *V15_TASKS], help="only these task folders")
    g.add_argument(
        "--overlap-gap",
        type=float,
        nargs=2,
        default=(2.0, 3.0),
        metavar=("MIN", "MAX"),
        help="v1.5: seconds of silence after the question before the overlap (default 2 3); longer "
        "gaps let a slow background answer start first, so the overlap meets the model talking",
    )

    r = sub.add_parser("run", help="stream the set through a running duplex server")
    r.add_argument("--data", type=Path, required=True)
    r.add_argument("--url", required=True, help="ws://HOST:PORT/v1/realtime (--protocol live: ws://HOST:PORT/v1/live/sessions)")
    r.add_argument("--protocol", choices=["realtime", "live"], default="realtime",
                   help="the wire: OpenAI Realtime (default) or GPT-Live; same output layout either way")
    r.add_argument("--pace", choices=["media", "realtime"], default="media")
    r.add_argument("--concurrency", type=int, default=1, help="samples streamed at once (default 1)")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds one clip may take (default 300)")
    r.add_argument("--label", help="name of this system in the score table (default: the server's model)")
    r.add_argument("--skip-existing", action="store_true", help="leave samples that already have output.wav")

    s = sub.add_parser("score", help="transcribe outputs and compute the metrics")
    s.add_argument(
        "--data",
        type=Path,
        action="append",
        required=True,
        help="a run data folder; repeat to put several systems in one table",
    )
    s.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    s.add_argument(
        "--asr",
        choices=["auto", "always", "never"],
        default="auto",
        help="auto: reuse an output.json newer than output.wav (default)",
    )
    s.add_argument("--gt", type=Path, help="backchannel ground truth (default: icc_gt_distribution.json in the set)")

    h = sub.add_parser("report", help="score runs and write one HTML page: tables and a timeline per sample")
    h.add_argument("data", type=Path, nargs="+", help="run data folders (as for score --data), one column each")
    h.add_argument("--html", type=Path, help="page to write; without it, print the tables as score does")
    h.add_argument("--asr", choices=["auto", "always", "never"], default="auto",
                   help="auto: reuse an output.json newer than output.wav (default)")
    h.add_argument("--gt", type=Path, help="backchannel ground truth (default: icc_gt_distribution.json in the set)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "generate":
        from bench.fdbench.generate import generate

        folders = generate(
            args.out,
            args.samples,
            args.v15_samples,
            args.seed,
            tuple(args.tasks or ()) or None,
            (args.overlap_gap[0], args.overlap_gap[1]),
        )
        print(f"wrote {len(folders)} samples under {args.out}")
        return 0
    if args.cmd == "run":
        from bench.fdbench.runner import run

        try:
            summary = run(args.data, args.url, args.pace, args.concurrency, args.timeout, args.label,
                          args.skip_existing, args.protocol)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"ran {len(summary.done)} samples; summary in {args.data / 'run.json'}")
        if summary.underruns:
            print(f"{summary.underruns} micro-turns were stepped before their input arrived (a busy machine or "
                  "network); their output is left out of output.wav, see run.json")
        for name, why in summary.failed.items():
            print(f"FAILED {name}: {why}", file=sys.stderr)
        for name, errs in summary.server_errors.items():
            print(f"server errors in {name}: {errs[:3]}", file=sys.stderr)
        return 1 if summary.failed else 0
    if args.cmd == "report" and args.html is not None:
        from bench.fdbench.html_report import write

        done = write(args.data, args.html, args.asr, args.gt)
        print(f"wrote {done['path']}: {done['samples']} sample runs, {done['bytes'] / 1e6:.2f} MB, "
              f"{done['seconds']} s")
        return 1 if any(not r["samples"] for r in done["results"]) else 0
    from bench.fdbench.report import render
    from bench.fdbench.score import score

    if args.cmd == "report":
        args.json = False
    results = [score(d, args.asr, args.gt, progress=not args.json) for d in args.data]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        print(render(results))
    # Scoring what could be scored is success; a sample that could not be scored is named above.
    return 1 if any(not r["samples"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
