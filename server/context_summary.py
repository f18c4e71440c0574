"""What the reasoner keeps of a conversation older than its context's budget: a running extractive summary
of the exchanges that fell off, and the facts the user stated (names, numbers, preferences), verbatim.

Extractive, not written by the reasoner: the embedded reasoner (SmolLM2-135M) does not summarise
reliably (it repeats its input back or drifts, see server/background_context.py), and a summary request
would queue behind answers on its single thread; a rule costs nothing, gives the same summary in media
and real-time pace, and never invents a fact. A larger backend could write the summary instead; the
notes block would stay as it is, since a summary may paraphrase a name or a number away.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_NOTE_CHARS = 200  # one fact; a transcript without punctuation is one long sentence
MAX_LINE_PART = 120  # what a summary line keeps of each side of an exchange

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_NUMBER_WORDS = (r"two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|"
                 r"seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|"
                 r"thousand|million")
# What makes a user's sentence a fact worth keeping word for word: something about the user, or a number.
_PERSONAL = re.compile(
    r"\bmy (?:[\w']+ ){0,2}(?:is|are|was|were)\b"  # my name is, my daughter's name is, my car is
    r"|\b(?:i am|i'm) (?:called|named|from|a|an|allergic|vegetarian|vegan|\d)"
    r"|\bcall me\b|\bi (?:live|work|was born|grew up)\b"
    r"|\bi (?:really )?(?:like|love|prefer|hate|enjoy|want|need|don't like|do not like|can't stand)\b"
    r"|\bremember (?:that|this)\b|\bfavou?rite\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(rf"\d|\b(?:{_NUMBER_WORDS})\b", re.IGNORECASE)
_TURN_WRAPPER = re.compile(r"^Conversation so far:\n|\n\nTask: .*\Z", re.DOTALL)
_LABEL = re.compile(r"^(?:User(?: \(typed\))?|Assistant|Camera): ", re.MULTILINE)


def user_facts(text: str) -> list[str]:
    """The sentences of a user's words that state a fact, verbatim (shortened only past MAX_NOTE_CHARS)."""
    out = []
    for sentence in _SENTENCE.split(text):
        sentence = sentence.strip()
        m = _PERSONAL.search(sentence) or _NUMBER.search(sentence)
        if not m:
            continue
        if len(sentence) > MAX_NOTE_CHARS:  # centred on what made it a fact
            start = max(0, min(m.start() - MAX_NOTE_CHARS // 2, len(sentence) - MAX_NOTE_CHARS))
            sentence = sentence[start : start + MAX_NOTE_CHARS].strip()
        out.append(sentence)
    return out


def personal(fact: str) -> bool:
    """About the user (a name, a preference), not only a number: kept longer when the notes are full."""
    return _PERSONAL.search(fact) is not None


def _first_sentence(text: str) -> str:
    text = " ".join(_LABEL.sub("", _TURN_WRAPPER.sub("", text)).split())
    first = _SENTENCE.split(text, maxsplit=1)[0]
    return first if len(first) <= MAX_LINE_PART else first[: MAX_LINE_PART - 3].rstrip() + "..."


def summary_line(user: str, answer: str) -> str:
    """One exchange that fell off the context, in a line: its first sentence on each side."""
    return f"- The user: {_first_sentence(user)} You: {_first_sentence(answer)}"


class RunningSummary:
    """The exchanges that fell off (one line each, the oldest lines falling off past `max_chars`) and the
    user's facts (past `max_note_chars` the oldest that is only a number falls off first, then the oldest;
    a repeated fact is kept once)."""

    def __init__(self, max_chars: int, max_note_chars: int) -> None:
        self.max_chars = max_chars
        self.max_note_chars = max_note_chars
        self.lines: list[str] = []
        self.notes: list[str] = []
        self.folded = 0  # exchanges summarised so far
        self.lines_dropped = 0  # summary lines that fell off the summary itself
        self.notes_dropped = 0

    def fold(self, exchanges: Iterable[tuple[str, str]]) -> None:
        for user, answer in exchanges:
            self.lines.append(summary_line(user, answer))
            self.folded += 1
        while len(self.lines) > 1 and sum(len(x) + 1 for x in self.lines) > self.max_chars:
            self.lines.pop(0)
            self.lines_dropped += 1

    def note(self, facts: Iterable[str]) -> None:
        for fact in facts:
            if fact in self.notes:
                self.notes.remove(fact)  # said again: it moves to the newest place
            self.notes.append(fact)
        while len(self.notes) > 1 and sum(len(x) + 3 for x in self.notes) > self.max_note_chars:
            self.notes.pop(next((i for i, n in enumerate(self.notes) if not personal(n)), 0))
            self.notes_dropped += 1

    def text(self) -> str:
        """The block that follows the system prompt (empty until something fell off or was noted)."""
        parts = []
        if self.notes:
            parts.append("What the user told you (their words):\n" + "\n".join(f"- {n}" for n in self.notes))
        if self.lines:
            omitted = f" ({self.lines_dropped} earlier exchanges omitted)" if self.lines_dropped else ""
            parts.append(f"Earlier in this conversation{omitted}:\n" + "\n".join(self.lines))
        return "\n\n".join(parts)

    def chars(self) -> int:
        return len(self.text())
