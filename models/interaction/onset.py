"""Taking the floor and handing off: the control head's decision, with two calibrated thresholds.

Every micro-turn the control head scores the five actions. Greedy decoding (argmax) takes the floor as
soon as `speak` outscores the rest, which with five classes can be at p(speak) 0.4: in a mid-sentence
pause, where the user has stopped but not finished, the tiny model's p(speak) rises to 0.4-0.65 for two
or three micro-turns, while after a finished question it rises to 0.6-0.9 (FD-bench-layout samples
stepped with every onset held back). So an *onset* (speaking after not speaking) needs p(speak) >=
`onset`; below it the best other action is taken. Once it speaks, greedy decoding goes on: the
threshold gates the start of a turn, never cuts one.

The threshold is a property of a checkpoint (how its probabilities are calibrated), so it is measured
on a tuning set (`bench.native.onset`) and, where it serves better than greedy decoding, recorded in
the checkpoint's metadata under `ONSET_KEY` (`--write`); `--native-onset` overrides it, and 0 is plain
greedy decoding (the default of a checkpoint that records none, the shipped one included: README).

Handing a request to the background reasoner is the opposite case: `delegate` is one micro-turn per
look-up in training (a rare class, weighted up in the loss and still seldom the argmax: at a held-out
look-up's end p(delegate) peaks at 0.1-0.4 while p(speak) wins, its holding phrase being next). So
where `delegate` > 0, a micro-turn that is not speaking hands off once p(delegate) >= `delegate`,
whatever else scores higher: the usual decision rule for a rare class (a threshold on its own
probability, not the argmax). It is calibrated like the onset threshold, on held-out episodes
(`train.evaluate` prints the curve: look-ups caught against hand-offs elsewhere), recorded under
`DELEGATE_KEY`, overridden by `--native-delegate`; 0 is the argmax.

Where the user's words are at hand (turn_check.py: `Words`) they settle more than the onset: whether the
model, once it takes the floor, hands off or speaks. Its own split between the two does not carry past
the training texts: on held-out episodes (training's sentences in new voices) a look-up's end gives
p(delegate) a median share of 0.5 of p(speak) + p(delegate), a question's 0.02; on requests no training
text holds (`bench.native.handoff`) it handed off 2 of 48 look-ups as served before, and a bar on that
share handed off plain questions more often than look-ups (0.5: 32 and 21 of 48). A look-up is what
training says it is, a request in so many words to look up, find, check or search (train/_texts.py), and
that is in the words (`turn_check.asks_to_look_up`); the model still decides when it takes the floor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from models.interaction.config import ACTIONS
from models.interaction.options import check_delegate, check_onset

ONSET_KEY = "onset_threshold"  # checkpoint metadata: p(speak) an onset needs, "0.65"
ONSET_NOTE_KEY = "onset_calibration"  # checkpoint metadata: how it was measured (set, figures)
DELEGATE_KEY = "delegate_threshold"  # checkpoint metadata: p(delegate) a hand-off needs, "0.2"
SPEAK, DELEGATE = ACTIONS.index("speak"), ACTIONS.index("delegate")


@dataclass(frozen=True)
class _Threshold:
    """One calibrated decision threshold: where it lives in the metadata, and how it is named and set."""

    key: str  # the checkpoint metadata entry
    what: str  # "onset", "delegate"
    unset: str  # the decision rule without one
    option: str  # the serving option that overrides it
    calibrate: str  # the tool that measures it
    check: Callable[[float], float]

    def from_metadata(self, meta: dict[str, str]) -> tuple[float, str]:
        raw = meta.get(self.key)
        if raw is None:
            return 0.0, f"{self.unset}: the checkpoint records no calibrated {self.what} threshold"
        try:
            return self.check(float(raw)), f"the checkpoint's calibrated {self.what} threshold {float(raw):.2f}"
        except ValueError:
            raise ValueError(f"the checkpoint's metadata {self.key}={raw!r} is not a probability in [0, 1); "
                             f"{self.calibrate}, or pass {self.option}") from None

    def choose(self, requested: float | None, meta: dict[str, str]) -> tuple[float, str]:
        if requested is not None:
            return self.check(requested), self.option
        return self.from_metadata(meta)


_ONSET = _Threshold(ONSET_KEY, "onset", "greedy", "--native-onset", "re-run bench.native.onset --write", check_onset)
_DELEGATE = _Threshold(DELEGATE_KEY, "delegate", "argmax", "--native-delegate", "calibrate it with train.evaluate",
                       check_delegate)


def onset_from_metadata(meta: dict[str, str]) -> tuple[float, str]:
    """(threshold, why) recorded in a checkpoint's metadata; 0 (greedy) where it records none."""
    return _ONSET.from_metadata(meta)


def choose_onset(requested: float | None, meta: dict[str, str]) -> tuple[float, str]:
    """(threshold, why): `requested` (`--native-onset`, `train.evaluate --onset`) where given, else the
    checkpoint's metadata (0 = greedy where it records none)."""
    return _ONSET.choose(requested, meta)


def choose_delegate(requested: float | None, meta: dict[str, str]) -> tuple[float, str]:
    """(threshold, why) for handing off: `requested` (`--native-delegate`, `train.evaluate --delegate`) where
    given, else the checkpoint's metadata (0 = the argmax where it records none)."""
    return _DELEGATE.choose(requested, meta)


@dataclass(frozen=True)
class Words:
    """What the words of the user's turn say (turn_check.py): `turn`, whether it is "finished",
    "unfinished" or "unclear"; `lookup`, whether they ask for something looked up (None: no words heard);
    `text`, the words (a hand-off's request: query.py), and `level`, how loud they were said (whose voice:
    turn_check.after_the_wait), not part of the verdict."""

    # "finished", "unfinished", "unclear"; WAITED for the one micro-turn the longest wait ends; BYSTANDER for
    # words said well under the user's own level (turn_check.whose); PENDING while a late verdict is awaited
    turn: str
    lookup: bool | None = None
    text: str = field(default="", compare=False)
    level: float | None = field(default=None, compare=False)  # the speech's active level, dBFS (None: none)


def decide(
    probs: Tensor,
    speaking: Sequence[bool] | Tensor,
    onset: float,
    delegate: float = 0.0,
    verdicts: Sequence[Words | None] | None = None,
) -> Tensor:
    """Actions [B] from action probabilities [B, len(ACTIONS)]; `speaking[b]`: row b spoke last micro-turn;
    `verdicts[b]`: what the words of the user's turn say (None: nothing judged), for a row not speaking."""
    best = probs.argmax(-1)
    judged = {b: v for b, v in enumerate(verdicts or ())
              if v is not None and (v.turn in _JUDGED or v.lookup is not None)}
    if onset <= 0.0 and delegate <= 0.0 and not judged:
        return best
    was = torch.as_tensor(speaking, dtype=torch.bool, device=probs.device)
    if onset > 0.0:
        unsure = (best == SPEAK) & ~was & (probs[:, SPEAK] < onset)
        if bool(unsure.any()):
            other = probs.clone()
            other[:, SPEAK] = -1.0
            best = torch.where(unsure, other.argmax(-1), best)
    if delegate > 0.0:
        # Not while speaking: every hand-off of training starts from silence (its holding phrase follows).
        best = torch.where(~was & (probs[:, DELEGATE] >= delegate), torch.full_like(best, DELEGATE), best)
    judged = {b: v for b, v in judged.items() if not bool(was[b])}
    return _with_verdicts(probs, best, judged) if judged else best


# The user said words and has been silent the longest wait since (turn_check.HOLD_TICKS, the cascade's longest
# wait at eagerness medium) without the model taking the floor: it is taken (turn_check.after_the_wait says
# which turns), as a listener answers a turn left hanging however unsure of it.
WAITED = "waited"
# The words were said `BYSTANDER_DB` quieter than the user's turns the model answered (turn_check.whose): a
# television or someone across the room, no turn of the user's. As the cascade, which never answers one.
BYSTANDER = "bystander"
# The words' verdict is due but not in yet (turn_check.LATE_TICKS: a busy machine): no onset until it is.
PENDING = "pending"
_JUDGED = ("finished", "unfinished", WAITED, BYSTANDER, PENDING)


def keener(a: Tensor, b: Tensor) -> Tensor:
    """Of two rows of action probabilities, the one keener to take the floor: speaking and handing off together
    furthest above the best other action (serving keeps it while a late verdict is awaited, PENDING)."""

    def margin(p: Tensor) -> float:
        rest = p.clone()
        rest[SPEAK] = rest[DELEGATE] = -1.0
        return float(p[SPEAK] + p[DELEGATE] - rest.max())

    return a if margin(a) > margin(b) else b


def _with_verdicts(probs: Tensor, best: Tensor, judged: dict[int, Words]) -> Tensor:
    """turn_check.py's rule, for the `judged` rows (not speaking; their words): on a finished turn a row that would
    stay silent takes the floor when speaking and handing off together outscore every other action, and so
    on an unclear one whose words ask for a look-up (a request that names what to look up is one: Whisper
    leaves "Check what time the concert starts on Friday" unpunctuated); on an unfinished one, a
    bystander's words, or a verdict still awaited (PENDING), it neither speaks nor hands off; on any other
    unclear one it decides alone; once the longest wait after words is over (WAITED) it takes the floor,
    whatever the probabilities. Where it takes the floor and the words were heard, they settle how: a
    hand-off where they ask for a look-up, else speech."""
    take = probs[:, SPEAK] + probs[:, DELEGATE]
    rest = probs.clone()
    rest[:, SPEAK] = -1.0
    rest[:, DELEGATE] = -1.0
    other_best, other = rest.max(-1)
    out = best.clone()
    for b, v in judged.items():
        chosen = int(best[b]) in (SPEAK, DELEGATE)
        if v.turn == WAITED:
            out[b] = DELEGATE if v.lookup else SPEAK
        elif v.turn in ("unfinished", BYSTANDER, PENDING):
            out[b] = other[b] if chosen else best[b]
        elif chosen or ((v.turn == "finished" or v.lookup) and bool(take[b] > other_best[b])):
            if v.lookup is None:  # no words heard: how it takes the floor stays the model's
                out[b] = best[b] if chosen else SPEAK
            else:
                out[b] = DELEGATE if v.lookup else SPEAK
    return out
