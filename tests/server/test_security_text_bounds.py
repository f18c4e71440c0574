"""What one session's typed text may pin is bounded in bytes, not characters.

A client types the longest messages allowed (16,000 characters) of 4-byte characters: each is 64 kB of
UTF-8 and as much in memory. Counted in items (200) and log entries (400), a session pinned tens of MB;
counted in bytes, its items and log stay within 1.5 MB of text, and the oldest items go first.
"""

from __future__ import annotations

from server.conversation import MAX_LOG_BYTES, ConversationLog, Entry, utf8_len
from server.items import MAX_ITEMS_BYTES, ConversationItems, item_bytes
from tests.wsclient import TICK, pcm16, random_pcm, recv_until, send, start_session

WIDE = "\U0001F600"  # 4 bytes in UTF-8, 4 in a Python string
MESSAGE = WIDE * 16_000  # the longest typed message (MAX_ITEM_TEXT_CHARS)


async def test_wide_typed_text_is_bounded_in_bytes(duplex_server) -> None:
    server = duplex_server("--model", "echo:0")
    ws, _ = await start_session(server.ws_url, pace="media")
    n = 40  # 2.5 MB of items: under the count bound (200), over the byte bound
    for i in range(n):
        await send(ws, {"type": "conversation.item.create",
                        "item": {"id": f"t{i}", "type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": MESSAGE}]}})
        await recv_until(ws, "conversation.item.added")
        await ws.send(pcm16(random_pcm(TICK, seed=i)))  # a micro-turn takes the typed text in
        await recv_until(ws, "response.output_audio.delta")

    # The oldest items are gone; the newest is whole.
    await send(ws, {"type": "conversation.item.retrieve", "item_id": "t0"})
    err, _ = await recv_until(ws, "error")
    assert err["error"]["code"] == "item_not_found", err
    await send(ws, {"type": "conversation.item.retrieve", "item_id": f"t{n - 1}"})
    got, _ = await recv_until(ws, "conversation.item.retrieved")
    assert got["item"]["content"][0]["text"] == MESSAGE
    await ws.close()


def test_log_bounded_in_bytes_on_every_way_in() -> None:
    log = ConversationLog()
    for i in range(100):
        log.add(i * 0.2, "user", MESSAGE, kind="typed")
    assert log.entries.bytes == sum(utf8_len(e.text) for e in log.entries) <= MAX_LOG_BYTES
    assert len(log.entries) == MAX_LOG_BYTES // utf8_len(MESSAGE)
    # A restored snapshot goes through the same bound.
    restored = ConversationLog()
    restored.entries.extend(Entry(0.0, "user", MESSAGE, "typed") for _ in range(100))
    assert restored.entries.bytes <= MAX_LOG_BYTES and len(restored.entries) == len(log.entries)
    # One speech entry growing past the whole bound keeps its newest part.
    speech = ConversationLog()
    for _ in range(40):
        speech.add(0.0, "user", MESSAGE)
    assert len(speech.entries) == 1 and speech.entries.bytes <= MAX_LOG_BYTES
    assert speech.entries[0].text.endswith(WIDE * 100)


def test_items_bounded_in_bytes() -> None:
    items = ConversationItems()
    for i in range(60):
        items.put({"id": f"i{i}", "type": "message", "content": [{"type": "input_text", "text": MESSAGE}]})
    assert items.bytes <= MAX_ITEMS_BYTES and items.get("i0") is None and items.get("i59") is not None
    items.put({"id": "i59", "type": "message", "content": []})  # announced again, smaller
    assert items.bytes == sum(item_bytes(i) for i in items.all())
