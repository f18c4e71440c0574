"""The Full-Duplex-Bench directory layout: finding samples, telling their task, reading their json.

One folder per sample; the task comes from the folder above it (the official names) or, for a
folder of another name, from which annotation file the sample holds. Readers raise `SampleError`
naming the sample and what is wrong, so a scorer can report it and go on with the rest.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Official v1.0 task folders -> task kind.
V1_TASKS = {
    "synthetic_pause_handling": "pause",
    "candor_pause_handling": "pause",
    "candor_turn_taking": "turn_taking",
    "synthetic_user_interruption": "interruption",
    "icc_backchannel": "backchannel",
}
# The v1.0 folders `bench.fdbench generate` can synthesise: candor_pause_handling holds real CANDOR
# recordings in the official set, and the synthetic pause task stands for it here.
GENERATED_V1_TASKS = (
    "synthetic_pause_handling",
    "candor_turn_taking",
    "synthetic_user_interruption",
    "icc_backchannel",
)
# v1.5 overlap subsets (official folder names); all score the same way.
V15_TASKS = ("user_interruption", "user_backchannel", "talking_to_other", "background_speech")
GT_DISTRIBUTION = "icc_gt_distribution.json"
# File that the runner leaves at the data root describing the run (model, pace, url).
RUN_INFO = "run.json"


class SampleError(Exception):
    """A sample that cannot be run or scored; the message names the sample and the fix."""

    def __init__(self, sample: "Sample | Path", message: str) -> None:
        path = sample.path if isinstance(sample, Sample) else sample
        super().__init__(f"{path}: {message}")


@dataclass(frozen=True)
class Sample:
    path: Path  # the sample folder
    group: str  # the task folder it sits in, e.g. "synthetic_pause_handling" or "user_interruption"
    kind: str  # pause | turn_taking | interruption | backchannel | overlap

    @property
    def name(self) -> str:
        return f"{self.group}/{self.path.name}"

    def file(self, name: str) -> Path:
        return self.path / name


def _kind_from_files(folder: Path) -> str | None:
    for name, kind in (
        ("pause.json", "pause"),
        ("turn_taking.json", "turn_taking"),
        ("interrupt.json", "interruption"),
        ("metadata.json", "overlap"),
    ):
        if (folder / name).exists():
            return kind
    return None


def _group_kind(folder: Path) -> str | None:
    if folder.name in V1_TASKS:
        return V1_TASKS[folder.name]
    if folder.name in V15_TASKS:
        return "overlap"
    return None


def _children(folder: Path) -> list[Path]:
    return sorted(
        (p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))),
        key=lambda p: (len(p.name), p.name),  # "2" before "10"
    )


def find_samples(root: Path) -> list[Sample]:
    """Every sample under `root` (a data root, a task folder, or one sample folder)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"data directory {root} does not exist; pass the folder `generate` wrote")
    samples: list[Sample] = []

    def visit(folder: Path, depth: int) -> None:
        kind = _group_kind(folder)
        if kind is not None:
            samples.extend(Sample(child, folder.name, kind) for child in _children(folder))
            return
        if (folder / "input.wav").exists():
            file_kind = _kind_from_files(folder)
            group = folder.parent.name
            samples.append(Sample(folder, group, file_kind or "unknown"))
            return
        if depth < 3:  # bounded: data roots are at most a couple of levels deep
            for child in _children(folder):
                visit(child, depth + 1)

    visit(root, 0)
    return samples


def load_json(sample: Sample, name: str) -> Any:
    path = sample.file(name)
    if not path.exists():
        raise SampleError(sample, f"missing {name}; every {sample.group} sample needs one")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SampleError(sample, f"{name} is not valid json ({e}); regenerate or fix it") from None


def _timestamp(sample: Sample, name: str, value: Any, index: int) -> float:
    try:
        ts = value[0]["timestamp"] if isinstance(value, list) else value["timestamps"]
        return float(ts[index])
    except (KeyError, IndexError, TypeError, ValueError):
        shape = '[{"timestamp": [start, end], ...}]' if name != "metadata.json" else '{"timestamps": [s, e]}'
        raise SampleError(sample, f"{name} has no usable timestamp; expected {shape}") from None


def turn_end(sample: Sample) -> float:
    """When the user's turn ends (turn_taking.json[0].timestamp[0])."""
    return _timestamp(sample, "turn_taking.json", load_json(sample, "turn_taking.json"), 0)


def interruption_span(sample: Sample) -> tuple[float, float]:
    """[start, end] of the user's interruption (interrupt.json[0].timestamp)."""
    data = load_json(sample, "interrupt.json")
    return (
        _timestamp(sample, "interrupt.json", data, 0),
        _timestamp(sample, "interrupt.json", data, 1),
    )


def overlap_span(sample: Sample) -> tuple[float, float]:
    """[start, end] of the v1.5 overlap (metadata.json timestamps)."""
    data = load_json(sample, "metadata.json")
    return _timestamp(sample, "metadata.json", data, 0), _timestamp(sample, "metadata.json", data, 1)


def find_gt_distribution(sample: Sample, explicit: Path | None = None) -> Path:
    """The backchannel ground truth: --gt, else icc_gt_distribution.json in the task folder or above."""
    if explicit is not None:
        return explicit
    for folder in (sample.path.parent, sample.path.parent.parent, sample.path.parent.parent.parent):
        if (folder / GT_DISTRIBUTION).exists():
            return folder / GT_DISTRIBUTION
    raise SampleError(
        sample,
        f"no {GT_DISTRIBUTION} found next to the task folder; pass --gt PATH (the official file) "
        "or regenerate the set with `generate`",
    )


def gt_for(sample: Sample, gt: dict[str, Any]) -> list[float]:
    """The sample's distribution, looked up the way eval_backchannel.py does (name, digits - 1, "0")."""
    import re

    key = sample.path.name
    if key not in gt:
        match = re.search(r"\d+", key)
        key = str(int(match.group()) - 1) if match else "0"
        if key not in gt:
            key = "0"
    if key not in gt:
        raise SampleError(sample, f"ground-truth distribution has no entry {sample.path.name!r} nor '0'")
    values = gt[key]
    if not isinstance(values, list) or not values or not all(isinstance(v, int | float) for v in values):
        raise SampleError(sample, f"ground-truth entry {key!r} is not a non-empty list of numbers")
    return [float(v) for v in values]
