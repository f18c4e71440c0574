"""The inbox's own rules: bounded audio (an overrun drops the oldest), one micro-turn taken at a time
with whatever else waits, room for media pace, and the overrun report's rate limit."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from server.inbox import Inbox, TextFull
from server.limits import MAX_PENDING_TEXT_CHARS
from streaming.types import TICK_SAMPLES


def _audio(ticks: float, value: float = 0.1) -> np.ndarray:
    return np.full(int(ticks * TICK_SAMPLES), value, np.float32)


def test_push_reports_completed_micro_turns_and_overruns() -> None:
    box = Inbox(max_backlog_ticks=2)
    assert not box.audio_started and not box.starved()
    assert box.push(_audio(0.5)) == (0, False)
    assert box.audio_started and box.starved(), "half a micro-turn: started, but nothing to step yet"
    assert box.push(_audio(0.5)) == (0, True)
    assert box.ready() == 1 and not box.starved()
    dropped, completed = box.push(_audio(2))
    assert dropped == TICK_SAMPLES and completed, "past two micro-turns the oldest samples go"
    assert box.ready() == 2 and box.dropped == TICK_SAMPLES and box.buffered == 2 * TICK_SAMPLES


def test_take_pads_a_short_micro_turn_and_takes_everything_else_once() -> None:
    box = Inbox()
    box.push(_audio(0.25))
    box.add_text("hello")
    box.video = np.zeros((2, 2, 3), np.uint8)
    box.request_cancel()
    assert box.pending() and box.steppable()
    tick = box.take([])
    assert tick.received == TICK_SAMPLES // 4 and tick.audio.shape == (TICK_SAMPLES,)
    assert tick.text == ["hello"] and tick.video is not None and tick.cancel
    assert box.heard == TICK_SAMPLES // 4
    again = box.take([])
    assert again.received == 0 and again.text == [] and again.video is None and not again.cancel
    assert not box.pending() and not box.steppable()


def test_typed_text_is_bounded() -> None:
    box = Inbox()
    box.add_text("x" * MAX_PENDING_TEXT_CHARS)
    with pytest.raises(TextFull):
        box.add_text("y")
    box.take([])
    box.add_text("y")  # taken: room again


async def test_media_pace_waits_for_room_until_a_micro_turn_is_taken() -> None:
    box = Inbox(max_backlog_ticks=1)
    box.push(_audio(1))
    assert not box.fits(TICK_SAMPLES) and box.fits(0)
    waiter = asyncio.create_task(box.wait_room())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    box.take([])
    await asyncio.wait_for(waiter, 1.0)
    assert box.fits(TICK_SAMPLES)
    box.push(_audio(1))
    waiter = asyncio.create_task(box.wait_room())
    await asyncio.sleep(0.01)
    assert box.clear() == TICK_SAMPLES
    await asyncio.wait_for(waiter, 1.0)


def test_an_overrun_is_reported_at_most_once_per_interval() -> None:
    box = Inbox()
    assert box.overrun_due(10.0, every=1.0)
    assert not box.overrun_due(10.5, every=1.0)
    assert not box.overrun_due(11.0, every=1.0)
    assert box.overrun_due(11.01, every=1.0)
