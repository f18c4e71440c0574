"""Which llama-server slot a request goes to, so that a conversation finds its own context again.

llama-server keeps, per slot, the tokens of the last request it served (prompt and answer) in its KV
cache; a request sent to that slot (`id_slot`) evaluates only what differs after their common prefix.
The reasoner contract carries no session id, and needs none: a session's next prompt starts with its
previous prompt and answer (server/background_context.py builds it append-only), so the slot whose
content shares the longest prefix with the new prompt is that session's slot. The table remembers what
it sent to each slot and picks, among the idle ones:
  1. the longest common prefix that covers the first two messages (the system prompt is the same for
     most sessions: sharing only it, or it and the start of a first question, does not make a slot
     anyone's; a session's later requests repeat its first question whole);
  2. a slot holding the conversation less the oldest turns its context has since dropped (its first
     turn after the system prompt is found further in the slot's text): llama-server's
     `--cache-reuse` shifts the turns kept into place instead of evaluating them again;
  3. otherwise the least recently used slot, empty ones first: with more live sessions than slots,
     the context used longest ago is the one dropped (llama-server keeps it in its RAM prompt cache
     when `--cache-ram` allows, and the next request of that session is served from there or rebuilt).
A request finds every slot busy only when more requests run at once than there are slots: it waits,
in arrival order, for the first to come free. Event-loop only (no locks); not tied to one loop.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from models.background.base import Message


class Key(NamedTuple):
    """A conversation as the slot table compares it."""

    text: str  # the messages as one string: what prefixes are compared on
    head: int  # length of its first message (the system prompt, shared by most sessions)
    own: int  # length of its first two messages: what a shared prefix must cover to be this conversation


def conversation_key(messages: list[Message], answer: str | None = None) -> Key:
    """`messages` as a `Key`; `answer`: an assistant turn the slot holds after them."""
    parts = [f"\x1e{m.get('role', '')}\x1f{m.get('content') or ''}" for m in messages]
    if answer is not None:
        parts.append(f"\x1eassistant\x1f{answer}")
    head = len(parts[0]) if parts else 0
    return Key("".join(parts), head, head + (len(parts[1]) if len(parts) > 1 else 0))


@dataclass
class _Slot:
    id: int
    content: str = ""  # conversation_key of what it holds ("" = nothing known)
    busy: bool = False
    used: int = 0  # LRU stamp: the table's counter when it was last handed out


class SlotTable:
    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a slot table needs at least one slot, got {n}")
        self._slots = [_Slot(i) for i in range(n)]
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._counter = 0
        self.hits = 0  # requests that found their conversation in a slot
        self.misses = 0

    def __len__(self) -> int:
        return len(self._slots)

    def pick(self, key: Key) -> int | None:
        """The idle slot for `key` (module docstring), marked busy; None when every slot is busy."""
        # The turn after the system prompt, as the slot's text would hold it further in: found there,
        # the slot holds this conversation before its context dropped its oldest turns.
        second = key.text[key.head:key.own] if key.own > key.head else ""
        best: _Slot | None = None
        best_score = (-1, -1, 0, 0)
        for s in self._slots:
            if s.busy:
                continue
            # Characters, not path components: what is wanted here (and it runs in C).
            shared = len(os.path.commonprefix([s.content, key.text])) if s.content else 0  # noqa: RUF071
            # 1. the longest shared prefix covering the first two messages; 2. the conversation less its
            # oldest turns; 3. an empty slot; 4. the least recently used.
            score = (shared if shared >= key.own else 0, bool(second) and second in s.content, not s.content, -s.used)
            if score > best_score:
                best, best_score = s, score
        if best is None:
            return None
        if best_score[0] or best_score[1]:
            self.hits += 1
        else:
            self.misses += 1
        self._counter += 1
        best.busy, best.used = True, self._counter
        best.content = ""  # unknown until the request ends (a failed request may leave anything)
        return best.id

    async def acquire(self, key: Key) -> int:
        """A slot for `key`, waiting (first come, first served) while all are busy."""
        woken = False  # a release woke this request: it goes before later arrivals
        while True:
            if woken or not self._waiters:
                slot = self.pick(key)
                if slot is not None:
                    return slot
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if woken:
                self._waiters.appendleft(fut)  # a new arrival took the slot first: stay at the front
            else:
                self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut in self._waiters:
                    self._waiters.remove(fut)
                elif fut.done() and not fut.cancelled():
                    self._wake()  # it was woken and will not take the slot: pass the wake on
                raise
            woken = True

    def release(self, slot: int, content: str) -> None:
        """The request on `slot` ended; the slot now holds `content` (a `Key`'s text; "" when unknown)."""
        s = self._slots[slot]
        s.busy, s.content = False, content
        self._wake()

    def forget(self) -> None:
        """The server restarted: no slot holds anything."""
        for s in self._slots:
            s.content = ""

    def _wake(self) -> None:
        """Hand one released slot to the longest waiting request."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
