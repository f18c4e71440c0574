"""Taking the floor: the control head's decision, except that starting to speak needs confidence.

Every micro-turn the control head scores the five actions. Greedy decoding (argmax) takes the floor as
soon as `speak` outscores the rest, which with five classes can be at p(speak) 0.4: in a mid-sentence
pause, where the user has stopped but not finished, the tiny model's p(speak) rises to 0.4-0.65 for two
or three micro-turns, while after a finished question it rises to 0.6-0.9 (FD-bench-layout samples
stepped with every onset held back). So an *onset* (speaking after not speaking) needs p(speak) >=
`onset`; below it the best other action is taken. Once it speaks, greedy decoding goes on: the
threshold gates the start of a turn, never cuts one.

The threshold is a property of a checkpoint (how its probabilities are calibrated), so it is measured
on a tuning set (`bench.native_onset`) and, where it serves better than greedy decoding, recorded in
the checkpoint's metadata under `ONSET_KEY` (`--write`); `--native-onset` overrides it, and 0 is plain
greedy decoding (the default of a checkpoint that records none, the shipped one included: README).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from models.interaction.config import ACTIONS
from models.registry import check_onset

ONSET_KEY = "onset_threshold"  # checkpoint metadata: p(speak) an onset needs, "0.65"
ONSET_NOTE_KEY = "onset_calibration"  # checkpoint metadata: how it was measured (set, figures)
SPEAK = ACTIONS.index("speak")


def onset_from_metadata(meta: dict[str, str]) -> tuple[float, str]:
    """(threshold, why) recorded in a checkpoint's metadata; 0 (greedy) where it records none."""
    raw = meta.get(ONSET_KEY)
    if raw is None:
        return 0.0, "greedy: the checkpoint records no calibrated onset threshold"
    try:
        return check_onset(float(raw)), f"the checkpoint's calibrated onset threshold {float(raw):.2f}"
    except ValueError:
        raise ValueError(f"the checkpoint's metadata {ONSET_KEY}={raw!r} is not a probability in [0, 1); "
                         "re-run bench.native_onset --write, or pass --native-onset") from None


def choose_onset(requested: float | None, meta: dict[str, str]) -> tuple[float, str]:
    """(threshold, why): `requested` (`--native-onset`, `train.evaluate --onset`) where given, else the
    checkpoint's metadata (0 = greedy where it records none)."""
    if requested is not None:
        return check_onset(requested), "--native-onset"
    return onset_from_metadata(meta)


def decide(probs: Tensor, speaking: Sequence[bool] | Tensor, onset: float) -> Tensor:
    """Actions [B] from action probabilities [B, len(ACTIONS)]; `speaking[b]`: row b spoke last micro-turn."""
    best = probs.argmax(-1)
    if onset <= 0.0:
        return best
    was = torch.as_tensor(speaking, dtype=torch.bool, device=probs.device)
    unsure = (best == SPEAK) & ~was & (probs[:, SPEAK] < onset)
    if not bool(unsure.any()):
        return best
    other = probs.clone()
    other[:, SPEAK] = -1.0
    return torch.where(unsure, other.argmax(-1), best)
