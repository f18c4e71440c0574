"""Per-session conversation log: both sides' transcripts with times, typed text, background results.

The background reasoner builds its context from this log. It is bounded: a session may run for hours,
and a client may type text of 4-byte characters, so the bound counts the text's UTF-8 bytes (an upper
bound on what its strings hold in memory), not only its entries; the oldest entries go first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Role = Literal["user", "assistant", "background", "system", "tool"]


@dataclass
class Entry:
    t: float  # seconds on the session's timeline (micro-turn index * 0.2)
    role: Role
    text: str
    kind: str = "speech"  # speech | typed | background | tool | note


MAX_LOG_ENTRIES = 400
MAX_LOG_BYTES = 512 * 1024  # the entries' text in UTF-8: what one session's log may pin


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))  # a client's JSON may hold lone surrogates


class Entries(deque[Entry]):
    """The log's entries, oldest first, bounded in number and in UTF-8 bytes of text on every way in
    (`append`, and `extend` when a session is restored from a snapshot)."""

    def __init__(self, max_entries: int = MAX_LOG_ENTRIES, max_bytes: int = MAX_LOG_BYTES) -> None:
        super().__init__(maxlen=max_entries)
        self.max_bytes = max_bytes
        self.bytes = 0

    def append(self, entry: Entry) -> None:
        if len(self) == self.maxlen:
            self.popleft()
        super().append(entry)
        self.grew(utf8_len(entry.text))

    def extend(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            self.append(entry)

    def popleft(self) -> Entry:
        entry = super().popleft()
        self.bytes -= utf8_len(entry.text)
        return entry

    def clear(self) -> None:
        super().clear()
        self.bytes = 0

    def grew(self, added: int) -> None:
        """The newest entry's text grew by `added` bytes (or it was appended): drop the oldest over the bound."""
        self.bytes += added
        while self.bytes > self.max_bytes and len(self) > 1:
            self.popleft()
        if self.bytes > self.max_bytes:  # one entry over the whole bound: its newest part is kept
            only = self[0]
            only.text = only.text.encode("utf-8", "surrogatepass")[-self.max_bytes:].decode("utf-8", "ignore")
            self.bytes = utf8_len(only.text)


class ConversationLog:
    def __init__(self, max_entries: int = MAX_LOG_ENTRIES, max_bytes: int = MAX_LOG_BYTES) -> None:
        self.entries = Entries(max_entries, max_bytes)

    def add(self, t: float, role: Role, text: str, kind: str = "speech") -> None:
        """Append text; consecutive fragments of the same role and kind merge into one entry."""
        if not text:
            return
        last = self.entries[-1] if self.entries else None
        if last is not None and last.role == role and last.kind == kind and kind == "speech":
            joined = _join(last.text, text)
            # Counted from the part added, not the whole entry: a long monologue grows tick by tick.
            added = utf8_len(text) + len(joined) - len(last.text) - len(text)
            last.text = joined
            self.entries.grew(added)
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
