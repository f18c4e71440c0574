"""What a connection has queued for its client: serialized events, bounded in bytes, and the Close sentinel.

Bounded in bytes, not in count: one echoed session.updated can be 100 kB, so a count bound let a
client that does not read pin hundreds of megabytes.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Close:
    """Outbox sentinel: the transport should close with this code and reason."""

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


class Outbox:
    """Serialized events waiting for the transport, bounded in bytes (not count: one echoed
    session.updated can be 100 kB). The Close sentinel is always accepted, past the bound."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: deque[str | Close] = deque()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def fits(self, size: int) -> bool:
        return self.bytes + size <= self.max_bytes

    def put(self, item: str | Close) -> None:
        if isinstance(item, str):
            self.bytes += len(item)
        self._items.append(item)
        self._ready.set()

    def get_nowait(self) -> str | Close:
        item = self._items.popleft()
        if isinstance(item, str):
            self.bytes -= len(item)
        if not self._items:
            self._ready.clear()
        return item

    async def get(self) -> str | Close:
        while not self._items:
            await self._ready.wait()
        return self.get_nowait()
