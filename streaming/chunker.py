"""Turns arbitrary-sized input frames into fixed 200 ms micro-turns.

A micro-turn is never skipped: when too little input arrived it is padded with silence and
`received` says how much was real (an underrun). Input beyond one micro-turn is kept for the next
ones (surplus), up to a bound; past the bound the oldest samples are dropped and counted (an overrun),
because a client running ahead of real time must not grow memory or latency without limit.
"""

from dataclasses import dataclass

import numpy as np

from streaming.samples import SampleQueue
from streaming.types import TICK_SAMPLES, Audio


@dataclass
class Chunk:
    audio: Audio  # float32[tick_samples], silence-padded
    received: int  # how many samples of `audio` really arrived


class Chunker:
    def __init__(self, tick_samples: int = TICK_SAMPLES, max_backlog_ticks: int = 10) -> None:
        if max_backlog_ticks < 1:
            raise ValueError("max_backlog_ticks must be at least 1")
        self.tick_samples = tick_samples
        self._queue = SampleQueue(tick_samples * max_backlog_ticks)

    @property
    def max_samples(self) -> int:
        """The backlog bound: samples beyond it are dropped, oldest first."""
        return self._queue.max_samples

    @property
    def buffered(self) -> int:
        """Samples waiting."""
        return len(self._queue)

    @property
    def dropped(self) -> int:
        """Samples dropped by the backlog bound, ever."""
        return self._queue.dropped

    def push(self, audio: Audio) -> int:
        """Append samples; returns how many old samples were dropped to respect the bound."""
        return self._queue.push(audio)

    def ready(self) -> int:
        """How many whole micro-turns are buffered."""
        return self.buffered // self.tick_samples

    def pop(self) -> Chunk:
        """Take one micro-turn, padding with silence if fewer samples are buffered."""
        out = np.zeros(self.tick_samples, dtype=np.float32)
        return Chunk(out, self._queue.pop_into(out))

    def clear(self) -> int:
        """Drop everything buffered (e.g. input_audio_buffer.clear); returns samples dropped."""
        return self._queue.clear()
