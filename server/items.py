"""A session's conversation items as its client saw them, by id: what `conversation.item.retrieve` reads.

The Realtime protocol names every item it announces (a typed message in `conversation.item.added`, the
assistant's answer in `response.done`, the user's spoken turn in its transcription's `completed` event),
and a client may ask for any of them again later, for example after it resumed on another replica. The
items belong to the session (they survive a resume) and travel in its snapshot (server/_continuity.py).

Bounded like the conversation log, in number and in the UTF-8 bytes of the items as JSON (a client may
fill its items with 4-byte characters): a session may run for hours; the oldest items go first.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

MAX_ITEMS = 200  # items kept per session; older ones can no longer be retrieved
MAX_ITEMS_BYTES = 1 << 20  # and their size as JSON in UTF-8: what one session's items may pin
MAX_ID_CHARS = 64  # a client-chosen item id is cut to this (server/realtime.py does the same)
END = "\x00end"  # `put(after=END)`: at the end of the conversation (None would mean its start)


def item_bytes(item: dict[str, Any]) -> int:
    """The item's size as compact JSON in UTF-8: an upper bound on what its strings hold in memory."""
    return len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


class ConversationItems:
    def __init__(self, max_items: int = MAX_ITEMS, max_bytes: int = MAX_ITEMS_BYTES) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()  # id -> item, oldest first
        self._sizes: dict[str, int] = {}  # id -> item_bytes
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, item_id: str) -> dict[str, Any] | None:
        return self._items.get(item_id)

    def last_id(self) -> str | None:
        """The newest item's id: the `previous_item_id` of an item added at the end."""
        return next(reversed(self._items), None)

    def put(self, item: dict[str, Any], after: str | None = END) -> None:
        """Keep `item` (a Realtime item with an `id`); an item announced again (a transcript completed
        later) replaces the earlier version in place. A new item goes at the end, or after the item
        `after` names (None: first in the conversation, the protocol's `root`)."""
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            return
        size = item_bytes(item)
        known = item_id in self._items
        self.bytes += size - self._sizes.get(item_id, 0)
        self._items[item_id] = item
        self._sizes[item_id] = size
        if not known and after is not END:
            self._place(item_id, after)
        # The newest item is kept whatever its size (each is bounded where it is made).
        while len(self._items) > self.max_items or (self.bytes > self.max_bytes and len(self._items) > 1):
            old, _ = self._items.popitem(last=False)
            self.bytes -= self._sizes.pop(old)

    def before(self, item_id: str) -> str | None:
        """The id of the item just before `item_id` (None: it is first, or unknown)."""
        previous = None
        for key in self._items:
            if key == item_id:
                return previous
            previous = key
        return None

    def _place(self, item_id: str, after: str | None) -> None:
        """Move the (newest) item to just after `after` (None: to the front): the later ones follow it."""
        later = False
        for key in list(self._items):
            if later and key != item_id:
                self._items.move_to_end(key)
            if key == after:
                later = True
        if after is None:
            self._items.move_to_end(item_id, last=False)

    def delete(self, item_id: str) -> bool:
        if item_id not in self._items:
            return False
        del self._items[item_id]
        self.bytes -= self._sizes.pop(item_id)
        return True

    def all(self) -> list[dict[str, Any]]:
        return list(self._items.values())

    def seen(self, event: dict[str, Any]) -> None:
        """Keep whatever item a server event announces (events that announce none are ignored)."""
        for item in announced(event):
            self.put(item)


def announced(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The items a server event announces, in the shape `conversation.item.retrieved` gives them."""
    etype = event.get("type")
    if etype in ("conversation.item.added", "conversation.item.created", "conversation.item.done"):
        item = event.get("item")
        return [item] if isinstance(item, dict) else []
    if etype == "response.done":
        output = event.get("response", {}).get("output", [])
        return [o for o in output if isinstance(o, dict)]
    if etype == "conversation.item.input_audio_transcription.completed":
        return [{"id": event.get("item_id"), "type": "message", "role": "user", "status": "completed",
                 "content": [{"type": "input_audio", "transcript": event.get("transcript", "")}]}]
    return []
