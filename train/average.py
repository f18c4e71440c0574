"""A weighted average of native checkpoints of one architecture (weight interpolation, "model soup").

    python -m train.average phase9.safetensors phase10.safetensors --weights 0.35 0.65 --out mix.safetensors

Two fine-tunes of one starting point usually sit in one basin of the loss, so the straight line
between their weights is a family of models whose behaviour moves between theirs (Wortsman et al.
2022, "Model soups"; Ilharco et al. 2023, "Editing models with task arithmetic"). Here that is a
cheap knob for a trade-off that training sets only coarsely: a phase trained with the pause scene
weighted up waits through mid-sentence pauses but answers late, the phase before it answers and
takes pauses; a point between them, chosen on a tuning set (`bench.native.onset`), is measured
like any checkpoint before it is shipped. No training, a second on a CPU.

What the output records: the tensors averaged in fp32 and written in the inputs' dtype; the metadata
the inputs must share (format, preset, config, the phrase set, written out explicitly: averaging
models that differ in any of them is refused, naming what differs); `command` (this one), `trainer`
(where every input was trained) and `averaged_from` (each input's weight and its own provenance:
command, step, commit, data seeds). What was *measured on* an input's weights (its phrase word
error, calibrated onset and delegate thresholds) is not carried over: it describes weights the
output does not have. Measure and record it again (`update_metadata`, `bench.native.onset --write`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from models.interaction.checkpoint import FORMAT, read_metadata
from models.interaction.config import current_names
from models.interaction.onset import DELEGATE_KEY, ONSET_KEY, ONSET_NOTE_KEY
from models.interaction.phrases import PHRASES_KEY, PhraseSet
from models.interaction.voice import PHRASE_WER_KEY

SHARED = ("format", "preset", "config")  # must be equal (and the phrase set): they say what the tensors mean
MEASURED = (PHRASE_WER_KEY, "phrase_word_error_how", ONSET_KEY, ONSET_NOTE_KEY, DELEGATE_KEY)  # per weights
PROVENANCE = ("command", "step", "trained_minutes", "commit", "data", "data_seed", "data_episodes", "init_from")


def _check_weights(weights: Sequence[float], n: int) -> list[float]:
    if len(weights) != n:
        raise ValueError(f"{len(weights)} weights for {n} checkpoints: give one weight per checkpoint")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {list(weights)}")
    total = sum(weights)
    return [w / total for w in weights]  # 0.35 0.65 and 35 65 mean the same


def average(paths: Sequence[Path], weights: Sequence[float], out: Path, command: str) -> dict[str, str]:
    """Write the weighted average of the checkpoints `paths` to `out`; returns its metadata."""
    if len(paths) < 2:
        raise ValueError("give at least two checkpoints to average")
    ws = _check_weights(weights, len(paths))
    metas = [read_metadata(p) for p in paths]
    for p, m in zip(paths, metas, strict=True):
        if m.get("format") != FORMAT:
            raise ValueError(f"{p} is not a duplex native checkpoint (metadata format {m.get('format')!r})")
        if "config" in m:  # older checkpoints name some fields otherwise: compared, and written, under today's names
            m["config"] = json.dumps(current_names(json.loads(m["config"])))
    for key in SHARED:
        differ = [str(p) for p, m in zip(paths, metas, strict=True) if m.get(key) != metas[0].get(key)]
        if differ:
            raise ValueError(f"{paths[0]} and {', '.join(differ)} differ in their {key!r}: only checkpoints of one "
                             "architecture and phrase set can be averaged")
    # The phrase set each decodes its text within, resolved (a train.cli checkpoint without one has the
    # training bank's) and written out explicitly: the average is no train.cli checkpoint.
    phrase_sets = [PhraseSet.from_metadata(m) for m in metas]
    differ = [str(p) for p, ps in zip(paths, phrase_sets, strict=True) if ps != phrase_sets[0]]
    if differ:
        raise ValueError(f"{paths[0]} and {', '.join(differ)} differ in their {PHRASES_KEY!r}: only checkpoints of "
                         "one architecture and phrase set can be averaged")
    acc: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for p, w in zip(paths, ws, strict=True):
        tensors = load_file(str(p))
        if acc and tensors.keys() != acc.keys():
            missing = sorted(set(acc) ^ set(tensors))[:3]
            raise ValueError(f"{p} has other tensors than {paths[0]} (e.g. {missing}): not the same architecture")
        for name, t in tensors.items():
            if name in acc and acc[name].shape != t.shape:
                raise ValueError(f"{p}: tensor {name} is {tuple(t.shape)}, {paths[0]} has {tuple(acc[name].shape)}")
            dtypes.setdefault(name, t.dtype)
            acc[name] = acc.get(name, torch.zeros(t.shape, dtype=torch.float32)) + w * t.float()
    meta = {k: metas[0][k] for k in SHARED if k in metas[0]}
    if phrase_sets[0] is not None:
        meta.update(phrase_sets[0].to_metadata())
    meta["command"] = command
    if all("trainer" in m for m in metas):
        # Trained weights (models/interaction/voice.py: `--voice auto` gives untrained ones the flow head).
        meta["trainer"] = "train.average"
    meta["averaged_from"] = json.dumps([
        {"file": str(p), "weight": round(w, 6), **{k: m[k] for k in PROVENANCE if k in m}}
        for p, w, m in zip(paths, ws, metas, strict=True)])
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtypes[k]).contiguous() for k, v in acc.items()}, str(out), metadata=meta)
    return meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.average", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("checkpoints", nargs="+", type=Path, help="native checkpoints of one architecture (2 or more)")
    ap.add_argument("--weights", nargs="+", type=float, default=None,
                    help="one weight per checkpoint, normalised to sum to 1 (default: equal)")
    ap.add_argument("--out", type=Path, required=True, help="the averaged checkpoint to write")
    a = ap.parse_args(argv)
    weights = a.weights if a.weights is not None else [1.0] * len(a.checkpoints)
    missing = [str(p) for p in a.checkpoints if not p.is_file()]
    if missing:
        print(f"average: no such checkpoint: {', '.join(missing)}", file=sys.stderr)
        return 2
    command = "python -m train.average " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        meta = average(a.checkpoints, weights, a.out, command)
    except ValueError as e:
        print(f"average: {e}", file=sys.stderr)
        return 2
    parts = ", ".join(f"{d['weight']:.3f} x {d['file']}" for d in json.loads(meta["averaged_from"]))  # paths as given
    print(f"wrote {a.out}: {parts}; measure it before use (its phrase word error and thresholds are not carried over)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
