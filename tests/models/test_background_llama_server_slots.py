"""Which llama-server slot a request goes to (models/background/slots.py): a conversation finds its own
slot again, the least recently used one is given away, and requests wait in order when all are busy."""

from __future__ import annotations

import asyncio

import pytest

from models.background.slots import SlotTable, conversation_key

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}


def convo(*turns: str) -> list[dict[str, str]]:
    roles = ["user", "assistant"]
    return [SYSTEM] + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


def test_a_conversation_finds_its_own_slot_again() -> None:
    table = SlotTable(3)
    a, b = convo("how do i look after a goldfish"), convo("what is the capital of france")
    slot_a, slot_b = table.pick(conversation_key(a)), table.pick(conversation_key(b))
    assert slot_a is not None and slot_b is not None and slot_a != slot_b
    table.release(slot_a, conversation_key(a, "Feed it once a day.").text)
    table.release(slot_b, conversation_key(b, "Paris.").text)
    # Each next request extends its own conversation: it goes where that conversation is.
    assert table.pick(conversation_key(convo("what is the capital of france", "Paris.", "and of spain"))) == slot_b
    assert table.pick(conversation_key(convo("how do i look after a goldfish", "Feed it once a day.",
                                              "how often"))) == slot_a
    assert (table.hits, table.misses) == (2, 2)


def test_sharing_only_the_system_prompt_does_not_take_a_conversations_slot() -> None:
    table = SlotTable(2)
    a = convo("how do i look after a goldfish")
    slot_a = table.pick(conversation_key(a))
    assert slot_a is not None
    table.release(slot_a, conversation_key(a, "Feed it.").text)
    # A new session (same system prompt, another question) gets the empty slot, not slot_a.
    assert table.pick(conversation_key(convo("tell me a joke"))) == 1 - slot_a


def test_the_least_recently_used_conversation_is_given_away() -> None:
    table = SlotTable(2)
    keys = [conversation_key(convo(q)) for q in ("first question", "second question", "third question")]
    s0 = table.pick(keys[0])
    assert s0 is not None
    table.release(s0, keys[0].text + "answer")
    s1 = table.pick(keys[1])
    assert s1 is not None
    table.release(s1, keys[1].text + "answer")
    assert table.pick(keys[2]) == s0  # the first conversation's slot was used longest ago


def test_a_conversation_whose_oldest_turn_was_dropped_finds_its_slot() -> None:
    table = SlotTable(3)
    turns = ("tell me about the moon", "It orbits the Earth.", "and the sun", "It is a star.")
    full = convo(*turns, "and mars")
    slot = table.pick(conversation_key(full))
    other = table.pick(conversation_key(convo("what is the capital of france")))
    assert slot is not None and other is not None
    table.release(slot, conversation_key(full, "A planet.").text)
    table.release(other, conversation_key(convo("what is the capital of france"), "Paris.").text)
    # The context dropped its oldest turn: the prompt no longer starts as the slot's text does, but the
    # turns it kept are there (llama-server shifts them into place), and an empty slot is not preferred.
    assert table.pick(conversation_key(convo(*turns[2:], "and mars", "A planet.", "and venus"))) == slot


async def test_requests_wait_in_order_when_every_slot_is_busy() -> None:
    table = SlotTable(1)
    key = conversation_key(convo("q"))
    first = await table.acquire(key)
    order: list[str] = []

    async def waiter(name: str) -> None:
        slot = await table.acquire(key)
        order.append(name)
        await asyncio.sleep(0)
        table.release(slot, "")

    tasks = [asyncio.create_task(waiter(n)) for n in ("a", "b", "c")]
    await asyncio.sleep(0.01)
    assert order == []
    tasks[1].cancel()  # one gives up while waiting: the others still get the slot, in order
    table.release(first, "")
    await asyncio.wait_for(asyncio.gather(tasks[0], tasks[2]), 1.0)
    assert order == ["a", "c"]
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]


def test_a_restart_forgets_what_the_slots_held() -> None:
    table = SlotTable(1)
    a = conversation_key(convo("goldfish"))
    slot = table.pick(a)
    assert slot is not None
    table.release(slot, conversation_key(convo("goldfish"), "Feed it.").text)
    table.forget()
    table.pick(conversation_key(convo("goldfish", "Feed it.", "how often")))
    assert table.hits == 0
