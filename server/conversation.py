"""Per-session conversation log: both sides' transcripts with times, typed text, background results.

The background reasoner builds its context from this log. It is bounded: a session may run for hours.
"""

from collections import deque
from dataclasses import dataclass
from typing import Literal

Role = Literal["user", "assistant", "background", "system", "tool"]


@dataclass
class Entry:
    t: float  # seconds on the session's timeline (micro-turn index * 0.2)
    role: Role
    text: str
    kind: str = "speech"  # speech | typed | background | tool | note


class ConversationLog:
    def __init__(self, max_entries: int = 400) -> None:
        self.entries: deque[Entry] = deque(maxlen=max_entries)

    def add(self, t: float, role: Role, text: str, kind: str = "speech") -> None:
        """Append text; consecutive fragments of the same role and kind merge into one entry."""
        if not text:
            return
        last = self.entries[-1] if self.entries else None
        if last is not None and last.role == role and last.kind == kind and kind == "speech":
            last.text = _join(last.text, text)
            return
        self.entries.append(Entry(t, role, text, kind))

    def recent(self, n: int = 40) -> list[Entry]:
        return list(self.entries)[-n:]


def _join(a: str, b: str) -> str:
    if not a:
        return b
    if a.endswith((" ", "\n")) or b.startswith((" ", "\n", ",", ".", "!", "?")):
        return a + b
    return a + " " + b
