"""AudioPacer: fixed frames on an absolute schedule, silence when empty, instant clear, learned margin."""

from __future__ import annotations

import time

import numpy as np
import pytest

from streaming.pacer import UNDERRUN_GAP_FRAMES, AudioPacer

RATE, FRAME = 48_000, 960


def ramp(n: int, start: int = 1) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32)


def test_frames_carry_the_queue_in_order_then_silence() -> None:
    p = AudioPacer(RATE, FRAME)
    p.push(ramp(2 * FRAME + 100))
    a, b, c, d = (p.take_frame() for _ in range(4))
    assert np.array_equal(a, ramp(FRAME)) and np.array_equal(b, ramp(FRAME, FRAME + 1))
    assert np.array_equal(c[:100], ramp(100, 2 * FRAME + 1)) and not c[100:].any()
    assert not d.any() and d.shape == (FRAME,) and d.dtype == np.float32
    assert p.stats.frames == 4 and p.stats.speech_frames == 3


def test_clear_drops_everything_queued_at_once() -> None:
    p = AudioPacer(RATE, FRAME)
    p.push(np.ones(10 * FRAME, np.float32))
    p.take_frame()
    assert p.clear() == 9 * FRAME
    assert not p.take_frame().any(), "the frame right after a clear must be silent"
    assert p.queued == 0 and p.stats.cleared_samples == 9 * FRAME


def test_queue_is_bounded_dropping_the_oldest() -> None:
    p = AudioPacer(RATE, FRAME, max_queue_seconds=0.1)  # 4,800 samples
    assert p.push(ramp(6000)) == 1200
    assert p.take_frame()[0] == 1201 and p.stats.overflow_samples == 1200


def test_a_late_producer_is_an_underrun_and_later_utterances_start_with_a_margin() -> None:
    p = AudioPacer(RATE, FRAME, max_start_frames=2)
    p.push(np.ones(2 * FRAME, np.float32))
    p.take_frame(), p.take_frame(), p.take_frame()  # the third frame is a gap: the next push is late
    p.push(np.ones(2 * FRAME, np.float32))
    assert p.stats.underruns == 1 and p.start_frames == 1
    assert p.take_frame().any(), "a late continuation plays at once (it is late already)"
    p.take_frame()
    for _ in range(UNDERRUN_GAP_FRAMES + 1):  # a pause: what comes next is a new utterance
        assert not p.take_frame().any()
    p.push(np.ones(FRAME, np.float32))
    assert not p.take_frame().any(), "a new utterance waits the learned margin (one frame)"
    assert p.take_frame().any()
    assert p.stats.underruns == 1


def test_a_punctual_producer_never_pays_a_margin() -> None:
    p = AudioPacer(RATE, FRAME)
    for _ in range(5):
        p.push(np.ones(10 * FRAME, np.float32))  # always in time: pushed before the queue ran dry
        assert all(p.take_frame().any() for _ in range(10))
    assert p.stats.underruns == 0 and p.start_frames == 0


async def test_frames_follow_an_absolute_schedule() -> None:
    p = AudioPacer(RATE, FRAME)
    frame_s = FRAME / RATE
    released = []
    for _ in range(15):
        _, index = await p.next_frame()
        released.append((index, time.monotonic()))
        time.sleep(0.004)  # consumer work (encoding) must not push the schedule back
    t0 = p.deadline(0)
    assert t0 is not None
    assert [i for i, _ in released] == list(range(15))
    lateness = [t - (t0 + index * frame_s) for index, t in released]
    assert min(lateness) > -1e-3, "no frame may leave before it is due"
    # Absolute deadlines: the 4 ms of work per frame never accumulates (a relative sleep would drift by
    # 14 * 4 = 56 ms). Tolerances leave room for a machine shared with other work.
    assert sorted(lateness)[len(lateness) // 2] < 0.01, f"frames are released late: {lateness}"
    assert lateness[-1] < 0.04, f"the schedule drifted: {lateness}"


async def test_a_stalled_consumer_resyncs_instead_of_bursting() -> None:
    p = AudioPacer(RATE, FRAME, resync_seconds=0.1)
    await p.next_frame()
    time.sleep(0.3)  # the event loop stalls for 15 frames' worth
    _, index = await p.next_frame()
    # The frame clock (RTP timestamps) follows wall time: the slots that passed are skipped.
    assert p.stats.resyncs == 1 and index == 1 + p.stats.skipped_frames and 13 <= index <= 17
    t = time.monotonic()
    _, after = await p.next_frame()
    assert after == index + 1 and time.monotonic() - t > 0.01, "after a resync frames are paced again, not burst"


def test_bad_arguments_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        AudioPacer(0, FRAME)
