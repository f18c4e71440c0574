"""What a detached session produced while its client was away, kept in order for its resume.

A session outlives its connection (server/sessions.py): while it is detached, the outputs of steps
already in flight, background answers and tool calls still arrive. They wait here, bounded in items and
bytes (server/limits.py), and are replayed to the next connection in the order they came; what fell off
is counted, and the runtime tells the resumed client how much it lost.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, Protocol

from models.base import TickOutput
from server.limits import BACKLOG_BYTES, BACKLOG_ITEMS


class Receiver(Protocol):
    """What a replay hands to: the connection the session resumed on (an OutputSink)."""

    def deliver(self, out: TickOutput, tick: int) -> None: ...

    def emit(self, event: dict[str, Any]) -> None: ...


class Backlog:
    """What a detached session produced (outputs of steps in flight, background answers, tool calls),
    kept in order for its resume. Bounded in items and bytes; what falls off is counted and reported."""

    def __init__(self, max_items: int = BACKLOG_ITEMS, max_bytes: int = BACKLOG_BYTES) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self._items: deque[tuple[int, TickOutput | dict[str, Any], int]] = deque()  # (bytes, item, tick)
        self.bytes = 0
        self.dropped = 0  # items dropped since the last replay

    def __len__(self) -> int:
        return len(self._items)

    def add_output(self, out: TickOutput, tick: int) -> None:
        # Text in UTF-8 bytes: counted in characters, 4-byte ones held twice the bound.
        size = int(out.audio.nbytes) + len(out.text.encode()) + len(out.user_text.encode()) + 64
        self._add(size, out, tick)

    def add_event(self, event: dict[str, Any]) -> None:
        self._add(len(json.dumps(event, separators=(",", ":"))), event, -1)

    def _add(self, size: int, item: TickOutput | dict[str, Any], tick: int) -> None:
        self._items.append((size, item, tick))
        self.bytes += size
        while len(self._items) > self.max_items or self.bytes > self.max_bytes:
            old, _, _ = self._items.popleft()
            self.bytes -= old
            self.dropped += 1

    def entries(self) -> list[tuple[TickOutput | dict[str, Any], int]]:
        """What is held, oldest first, as (output or event, tick; -1 for an event): a session's snapshot."""
        return [(item, tick) for _, item, tick in self._items]

    def replay(self, sink: Receiver) -> int:
        """Hand everything to `sink` in order; returns how many items had been dropped (then resets it)."""
        while self._items:
            _, item, tick = self._items.popleft()
            if isinstance(item, TickOutput):
                sink.deliver(item, tick)
            else:
                sink.emit(item)
        self.bytes = 0
        dropped, self.dropped = self.dropped, 0
        return dropped
