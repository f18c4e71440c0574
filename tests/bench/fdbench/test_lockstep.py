"""Media pace with several sessions: the client's shared clock of micro-turns (bench/fdbench/lockstep.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from bench.fdbench.lockstep import Lockstep, Slot


async def _sent_within(turn: Awaitable[None], seconds: float = 0.05) -> bool:
    try:
        await asyncio.wait_for(turn, seconds)
    except TimeoutError:
        return False
    return True


async def test_no_slot_runs_more_than_one_micro_turn_ahead() -> None:
    lock = Lockstep(2)
    a, b = Slot(lock, 0), Slot(lock, 1)
    assert await _sent_within(a.turn(0)) and await _sent_within(b.turn(0))
    await a.answered(1)
    assert not await _sent_within(a.turn(1))  # B's micro-turn 0 is not answered yet
    await b.answered(1)
    assert await _sent_within(a.turn(1))
    # A waiting slot is woken when the other one moves, not by polling.
    waiting = asyncio.create_task(a.turn(2))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await b.answered(2)
    await asyncio.wait_for(waiting, 1.0)


async def test_a_new_sample_joins_at_its_slots_position_and_a_retired_slot_is_not_waited_for() -> None:
    lock = Lockstep(2)
    first = Slot(lock, 0)
    await first.answered(30)  # a 30-micro-turn clip (with its grace) done
    await lock.answered(1, 31)
    second = Slot(lock, 0)
    assert second.join == 30  # its micro-turn 0 is shared micro-turn 30
    assert await _sent_within(second.turn(1))  # shared 31: slot 1 has had 30 answered
    assert not await _sent_within(second.turn(2))
    await lock.retire(1)
    assert await _sent_within(second.turn(50))


def test_a_lockstep_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        Lockstep(0)
