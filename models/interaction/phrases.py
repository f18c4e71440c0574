"""What the native model may write: its closed phrase set, and the text head decoded within it.

A checkpoint trained on `train/_texts.py` only ever saw the assistant say a closed set of replies, and
"Here is what I found." followed by a background result it had read. Its text head predicts the
bytes of one micro-turn in parallel (4 positions from one hidden state), so greedy free decoding
drifts off every phrase (the shipped `native:tiny` writes "I aa" then spaces). Decoding within the set
keeps the model's choice (the highest-scoring byte among those that continue some allowed utterance)
and makes every utterance a whole phrase, word-exact: a trie walk over the allowed utterances, i.e.
grammar-constrained decoding, on the inference thread (a few hundred byte comparisons a micro-turn).

The set comes from the checkpoint's metadata (`PHRASES_KEY`, written at export); a checkpoint of
`train.cli` without that key (the first shipped ones) uses `TRAINED_REPLIES` / `TRAINED_ANSWER_LEAD`,
copies of train/_texts.py (models/ may not import train/; a test keeps them equal).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from models.interaction.config import NO_BYTE

PHRASES_KEY = "phrases"  # checkpoint metadata: JSON {"replies": [...], "answer_lead": "..."}
# Bytes a micro-turn writes at least while an utterance is unfinished: train/features.py spreads a
# phrase over the micro-turns its audio lasts, ~3 bytes each (Piper joe speaks ~14 characters/s);
# fewer would leave the talker waiting for words the model has in effect already chosen.
MIN_BYTES_PER_TURN = 3
ANSWERS_KEPT = 4  # background results an answer may quote: the newest few
# Phrases one utterance may chain, a space apart: training answers a question with up to three
# (train/episodes.py `long_reply`), so a longer chain is nothing the model learnt to say, and the
# bound keeps a text head that likes spaces from chaining while it holds the floor.
MAX_CHAINED = 3

TRAINED_REPLIES = (
    "Sure, I can help with that.",
    "Okay, let me think about it.",
    "Yes, that sounds like a good plan.",
    "I am not completely sure.",
    "Thank you for telling me.",
    "Good morning, how are you?",
    "That is a great question.",
    "No problem at all.",
    "I think you should try it.",
    "That makes a lot of sense.",
    "Could you say that again?",
    "I would start with the basics.",
    "It depends on the weather.",
    "Please give me one moment.",
    "That sounds wonderful.",
    "I agree with you.",
    "Let me explain it step by step.",
    "You are very welcome.",
    "Maybe later this afternoon.",
    "I really like that idea.",
)
TRAINED_ANSWER_LEAD = "Here is what I found."


@dataclass(frozen=True)
class PhraseSet:
    """The utterances a checkpoint was trained to write: fixed replies, and `answer_lead` + " " + a
    background result the session has received."""

    replies: tuple[str, ...]
    answer_lead: str

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> PhraseSet | None:
        """The checkpoint's set; the trained default for a `train.cli` checkpoint without one; None
        (free decoding) for anything else, e.g. random weights."""
        if PHRASES_KEY in meta:
            d = json.loads(meta[PHRASES_KEY])
            return cls(tuple(d["replies"]), d["answer_lead"])
        if meta.get("trainer") == "train.cli":
            return cls(TRAINED_REPLIES, TRAINED_ANSWER_LEAD)
        return None

    def to_metadata(self) -> dict[str, str]:
        return {PHRASES_KEY: json.dumps({"replies": list(self.replies), "answer_lead": self.answer_lead})}


@dataclass
class PhraseWriter:
    """One session's constrained text decoding: the utterance written so far and the results it may quote."""

    phrases: PhraseSet
    prefix: bytearray = field(default_factory=bytearray)  # bytes of the current phrase written so far
    done: list[bytes] = field(default_factory=list)  # this utterance's phrases finished before the current one
    answers: list[bytes] = field(default_factory=list)  # background results received (complete lines)
    _line: bytearray = field(default_factory=bytearray)  # a background line still arriving
    utterances: int = 0  # utterances begun so far
    began_another: bool = False  # the last `write` began an utterance after an earlier one

    def hear_background(self, data: bytes) -> None:
        """Background bytes as they reach the session (the stream the model reads)."""
        self._line += data
        *lines, rest = bytes(self._line).split(b"\n")
        self._line = bytearray(rest)
        for line in lines:
            if line.strip() and not line.startswith(b"[background error"):
                self.answers = [*self.answers, line.strip()][-ANSWERS_KEPT:]

    def allowed(self) -> list[bytes]:
        """What the current phrase may become: a reply, or (first in its utterance) an answer. Training
        chains replies only; an answer is an utterance of its own."""
        replies = [p.encode() for p in self.phrases.replies]
        if self.done:
            return replies
        lead = self.phrases.answer_lead.encode()
        return replies + [lead + b" " + a for a in self.answers]

    def _continuing(self) -> list[bytes]:
        return [u for u in self.allowed() if u.startswith(self.prefix)]

    def reset(self) -> None:
        """A new utterance starts (the model took the floor again, or stopped)."""
        self.prefix.clear()
        self.done.clear()
        self.began_another = False

    @property
    def chained(self) -> int:
        """Phrases of this utterance finished before the current one."""
        return len(self.done)

    @property
    def complete(self) -> bool:
        """The current phrase is one whole allowed phrase and no longer one continues it."""
        return _whole(self.prefix, self._continuing())

    def committed(self) -> str | None:
        """The utterance up to the end of its current phrase once only one allowed phrase continues what
        was written, else None: the rest of that phrase is then forced, so the talker can speak it whole
        (the utterance's earlier phrases, a space apart, come first: the talker speaks what is new)."""
        left = self._continuing()
        if len(left) != 1 or not self.prefix:
            return None
        return b" ".join([*self.done, left[0]]).decode("utf-8", "replace")

    def write(self, logits: torch.Tensor) -> list[int]:
        """logits [T, 257] (bytes and NO_BYTE) of one micro-turn -> the T bytes written (NO_BYTE padded).

        Each position takes the highest-scoring byte among those that continue an allowed utterance;
        NO_BYTE may win only after `MIN_BYTES_PER_TURN` bytes while a phrase is unfinished. Once the
        phrase is complete the choice is a space, which begins another reply of the set (up to
        `MAX_CHAINED` in an utterance, after a reply, not an answer: as trained), or NO_BYTE; where
        nothing continues what was written, nothing more is."""
        out: list[int] = []
        scores = logits.float()
        fresh = not self.prefix and not self.done
        space = ord(" ")
        for j in range(scores.shape[0]):
            left = self._continuing()
            if _whole(self.prefix, left):
                answer = self.prefix.decode("utf-8", "replace") not in self.phrases.replies
                if answer or self.chained + 1 >= MAX_CHAINED or scores[j, space] <= scores[j, NO_BYTE]:
                    break
                out.append(space)  # the phrase is done and the model goes on: another phrase follows
                self.done.append(bytes(self.prefix))
                self.prefix.clear()
                continue
            nxt = sorted({u[len(self.prefix)] for u in left if len(u) > len(self.prefix)})
            if not nxt:
                break
            options = nxt + ([NO_BYTE] if j >= MIN_BYTES_PER_TURN and out[-1:] != [space] else [])
            best = options[int(scores[j, options].argmax())]
            if best == NO_BYTE:
                break
            out.append(best)
            self.prefix.append(best)
        began = fresh and bool(out)
        self.began_another = began and self.utterances > 0
        self.utterances += began
        return out + [NO_BYTE] * (scores.shape[0] - len(out))


def _whole(prefix: bytearray, left: list[bytes]) -> bool:
    """`prefix` is one whole allowed phrase and none of those still continuing it (`left`) is longer."""
    return bool(left) and all(u == prefix for u in left)


def written_text(rows: Sequence[int]) -> bytes:
    return bytes(b for b in rows if b != NO_BYTE)
