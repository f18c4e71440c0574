"""The heard-words channel: what a streaming recogniser heard the user say, as bytes the model reads.

An option of a checkpoint (`InteractionConfig.heard_tokens` > 0), not of the architecture: the model
stays encoder-free on its audio, and a checkpoint without the channel runs exactly as before. Its
reason is the mid-sentence pause: "I was thinking that we could" and "I was thinking that we could
go" sound alike at their end, and a small model trained on CPU minutes did not learn to tell them
apart from audio alone; the last word says it (see docs/architecture.md, "The heard-words channel").

The same rules, and the same recogniser (listener.py), run in training and in serving, so that what
the model learns to read is what it gets:

* words are lower case letters and apostrophes (`words_of`), what pocketsphinx writes;
* the model reads the first `heard_tokens` bytes of the last word of the recogniser's partial
  hypothesis, held while the partial has none (`LastWord`), added onto the user-audio slots
  (`InteractionTransformer.embed`). The partial of a micro-turn's audio is collected one micro-turn
  later, so a clause's last word is there one micro-turn after the one it ends in: the earliest a
  streaming recogniser can give it, and before a reply is due (2-3 micro-turns after the user stops,
  train/episodes.py). A later partial may revise it; the value simply changes. A word, not a stream of
  them: a stream of every word at 4 bytes a micro-turn fell seconds behind fluent speech, and the word
  a clause ends on is what tells a pause from an end ("because", "and", "could");
* a word is *committed* (final) once the partial has held it for two collections, or a later word
  follows it (`WordCommitter`): the committed words are what a delegation asks the reasoner.
"""

from __future__ import annotations

import re

from models.interaction.config import NO_BYTE

_NOT_WORD = re.compile(r"[^a-z']+")


def words_of(text: str) -> list[str]:
    """Recogniser or script text -> its words as the channel writes them (no case, digits or punctuation)."""
    return [w for w in _NOT_WORD.split(text.lower()) if w.strip("'")]


class WordCommitter:
    """Successive partial hypotheses of one utterance -> the words that became final.

    A partial can still change its last words; a word is committed when it is followed by another, or
    when two collections in a row agree on it. Committed words are never taken back: a later revision
    of one is ignored (the model read it already)."""

    def __init__(self) -> None:
        self.done = 0  # words of the current utterance committed
        self.last: list[str] = []

    def update(self, hypothesis: str) -> list[str]:
        words = words_of(hypothesis)
        stable = 0
        while stable < min(len(words), len(self.last)) and words[stable] == self.last[stable]:
            stable += 1
        final = max(len(words) - 1, stable)  # every word but the last, and the last once it held
        out = words[self.done : final] if final > self.done else []
        self.done = max(self.done, final)
        self.last = words
        return out

    def flush(self, hypothesis: str) -> list[str]:
        """The user stopped speaking (the model's voice head says so) but the utterance stays open: commit
        every word of the hypothesis now, so the turn's transcript is whole when it ends."""
        words = words_of(hypothesis)
        out = words[self.done :]
        self.done, self.last = max(self.done, len(words)), words
        return out

    def finish(self, hypothesis: str) -> list[str]:
        """The utterance ended: what was not yet committed of its final hypothesis; starts afresh."""
        out = self.flush(hypothesis)
        self.done, self.last = 0, []
        return out


class LastWord:
    """The channel's value: the newest word's first `width` bytes, held until another comes, NO_BYTE-padded."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.value = [NO_BYTE] * width

    def push(self, words: list[str]) -> None:
        if words:
            b = list(words[-1].encode()[: self.width])
            self.value = b + [NO_BYTE] * (self.width - len(b))

    def take(self) -> list[int]:
        return list(self.value)
