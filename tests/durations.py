"""The order the parallel suite hands out its test files: the longest first.

`make test` runs the files on several workers, a whole file per worker (`--dist loadfile`: a module's
servers and models stay in one process). Which file a worker takes next decides when the suite ends: a
file of two minutes taken last keeps one worker busy while the others idle. pytest-xdist's own order is
by the number of tests in a file, which puts the slow few-test files (a browser, a cascade, a cluster)
last. So `make test` turns that off (`--no-loadscope-reorder`) and each worker sorts its collection by
`durations.json`, each file's seconds in an earlier run (longest processing time first, the classic
greedy schedule). A file missing from it (a new one) counts `DEFAULT_S`.

Refresh the figures from the junit file the last `make test` wrote:

    python -m tests.durations [.pytest_cache/junit-parallel.xml]
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = Path(__file__).with_name("durations.json")
JUNIT = ROOT / ".pytest_cache" / "junit-parallel.xml"
DEFAULT_S = 10.0  # a file not measured yet: about a server start and a few exchanges


def load(path: Path = FIGURES) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {}  # no figures: the collection order stands


def order(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Sort `items` in place, files by their seconds (longest first), tests inside a file as collected."""
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::", 1)[0], i)

    def key(pair: tuple[int, pytest.Item]) -> tuple[float, int, int]:
        i, item = pair
        file = item.nodeid.split("::", 1)[0]
        return -seconds.get(file, DEFAULT_S), first_seen[file], i

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


def _file_of(classname: str) -> str | None:
    """junit's `classname` is the dotted module, then any class: the longest prefix that is a file."""
    parts = classname.split(".")
    if not all(parts):
        return None  # "" (a report about no test) or a name no module has
    for n in range(len(parts), 0, -1):
        path = Path(*parts[:n]).with_suffix(".py")
        if (ROOT / path).is_file():
            return path.as_posix()
    return None


def from_junit(path: Path) -> dict[str, float]:
    """Each file's seconds (setup, call and teardown of all its tests) in a junit report."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        file = _file_of(case.get("classname", ""))
        if file is not None:
            totals[file] += float(case.get("time") or 0.0)
    return {f: round(s, 1) for f, s in sorted(totals.items(), key=lambda kv: -kv[1])}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Refresh tests/durations.json from a junit report of `make test`.")
    ap.add_argument("junit", nargs="?", type=Path, default=JUNIT, help="junit XML (default: %(default)s)")
    args = ap.parse_args(argv)
    if not args.junit.is_file():
        print(f"error: no junit report at {args.junit}; run `make test` first (it writes one)", file=sys.stderr)
        return 2
    figures = from_junit(args.junit)
    if not figures:
        print(f"error: {args.junit} names no test file of this checkout", file=sys.stderr)
        return 2
    FIGURES.write_text(json.dumps(figures, indent=0) + "\n")
    total = sum(figures.values())
    print(f"{FIGURES.relative_to(ROOT)}: {len(figures)} files, {total:.0f} s in all; the longest: "
          + ", ".join(f"{f} {s:.0f} s" for f, s in list(figures.items())[:5]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
