"""Output pacing: turns 200 ms micro-turns of audio into fixed frames released on an absolute schedule.

The engine hands over one micro-turn (4,800 samples at 24 kHz) at a time, in bursts. A real-time
transport (the WebRTC output track) must instead release one short frame every 20 ms, forever:
silence when nothing is queued, and nothing queued any more once the speaker is stopped (barge-in).

Frame n is due at `t0 + n * frame_seconds` (a `DeadlineClock`), so scheduling errors never
accumulate. When the consumer falls far behind (the event loop stalled), the missed slots are skipped
instead of bursting out every missed frame at once, which the receiver would only buffer.

Jitter: a producer that delivers 200 ms at a time, a little late, leaves the queue dry for a frame in
the middle of speech (an underrun: the listener hears a 20 ms gap). The gap itself shifts the rest of
the stream one frame later, which absorbs that producer's jitter; and the pacer remembers it, starting
later utterances `start_frames` frames late (at most `max_start_frames`), so that each new utterance
does not hit the same gap again. A producer that is never late never pays that latency.

What the pacer does not know: codecs, RTP, sessions. It moves float32 samples and keeps time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from streaming.clock import DeadlineClock
from streaming.samples import SampleQueue
from streaming.types import Audio

UNDERRUN_GAP_FRAMES = 4  # speech that resumes after at most this many silent frames was late, not new


@dataclass
class PacerStats:
    frames: int = 0  # frames released
    speech_frames: int = 0  # frames that carried queued audio (fully or partly)
    samples: int = 0  # queued samples released so far (their position in the pushed stream)
    underruns: int = 0  # speech resumed after a gap of at most UNDERRUN_GAP_FRAMES silent frames
    cleared_samples: int = 0  # samples dropped by clear() (barge-in, cancel)
    overflow_samples: int = 0  # samples dropped because more than max_queue was queued
    late_frames: int = 0  # frames released more than one frame after their deadline
    resyncs: int = 0  # stalls past resync_seconds, after which the missed slots were skipped
    skipped_frames: int = 0  # slots skipped by resyncs (no frame was ever sent for them)


class AudioPacer:
    """A bounded sample queue read out in fixed frames on an absolute schedule.

    `push` and `clear` are called by the producer (on the event loop); `next_frame` by the consumer,
    which awaits it in a loop (aiortc calls its track's `recv` back to back).
    """

    def __init__(self, rate: int, frame_samples: int, max_queue_seconds: float = 2.0,
                 resync_seconds: float = 0.25, max_start_frames: int = 2,
                 now: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or frame_samples <= 0:
            raise ValueError(f"rate and frame_samples must be positive, got {rate} and {frame_samples}")
        self.rate = rate
        self.frame_samples = frame_samples
        self.frame_seconds = frame_samples / rate
        self.resync_seconds = resync_seconds  # lateness past which the schedule restarts from now
        self._now = now
        self._queue = SampleQueue(int(max_queue_seconds * rate))  # bounded: latency, memory
        self.max_start_frames = max_start_frames
        self.start_frames = 0  # silent frames before a new utterance starts; grows with each underrun
        self._hold = 0  # silent frames still to release before the queued utterance starts
        self._last_audio = -(10**9)  # stats.frames count when the last frame carrying audio was released
        self._clock: DeadlineClock | None = None  # started by the first next_frame()
        self._index = 0  # next frame's index on the schedule
        self.stats = PacerStats()

    # -- producer side -----------------------------------------------------------------------

    def push(self, audio: Audio) -> int:
        """Queue samples; returns how many of the oldest were dropped to respect max_queue."""
        if len(audio) == 0:
            return 0
        if self.queued == 0:
            silent = self.stats.frames - self._last_audio  # silent frames since speech last played
            if 1 <= silent <= UNDERRUN_GAP_FRAMES:
                self.stats.underruns += 1  # the producer was late: the listener heard a gap
                self.start_frames = min(self.max_start_frames, self.start_frames + 1)
            elif silent > UNDERRUN_GAP_FRAMES:
                self._hold = self.start_frames  # a new utterance: start it with the learned margin
        excess = self._queue.push(audio)
        self.stats.overflow_samples += excess
        return excess

    def clear(self) -> int:
        """Drop everything queued at once (the speaker stopped); returns samples dropped.

        The next frame released is silence, so the listener hears the stop within one frame.
        """
        n = self._queue.clear()
        self._hold = 0
        self._last_audio = -(10**9)  # what follows is a new utterance, not a late continuation
        self.stats.cleared_samples += n
        return n

    # -- consumer side -----------------------------------------------------------------------

    def take_frame(self) -> Audio:
        """The next frame right now, silence-padded: float32[frame_samples]. No waiting."""
        out = np.zeros(self.frame_samples, dtype=np.float32)
        self.stats.frames += 1
        if self._hold > 0:
            self._hold -= 1
            return out
        n = self._queue.pop_into(out)
        if n:
            self.stats.speech_frames += 1
            self.stats.samples += n
            self._last_audio = self.stats.frames
        return out

    async def next_frame(self) -> tuple[Audio, int]:
        """Wait until the next frame is due, then return it and its index on the schedule.

        `index * frame_samples` is the frame's place on a sample clock tied to wall time (RTP
        timestamps): after a stall the clock skips the frames that were never sent, so a receiver
        sees a short loss, not a burst of late packets that would make its jitter buffer grow.
        """
        if self._clock is None:
            self._clock = DeadlineClock(self.frame_seconds, now=self._now)
        index = self._index
        lateness = await self._clock.sleep_until(index)
        if lateness > self.frame_seconds:
            self.stats.late_frames += 1
        if lateness > self.resync_seconds:
            # The consumer stalled: skip the missed slots instead of bursting out a backlog of frames.
            missed = int(lateness / self.frame_seconds)
            index += missed
            self.stats.resyncs += 1
            self.stats.skipped_frames += missed
        self._index = index + 1
        return self.take_frame(), index

    @property
    def queued(self) -> int:
        """Samples waiting to be released."""
        return len(self._queue)

    @property
    def next_index(self) -> int:
        """Index of the next frame to be released: audio pushed now (onto an empty queue) starts there."""
        return self._index

    def deadline(self, index: int) -> float | None:
        """When frame `index` is (or was) due; None before the first frame."""
        if self._clock is None:
            return None
        return self._clock.deadline(index)
