"""Turns arbitrary-sized input frames into fixed 200 ms micro-turns.

A micro-turn is never skipped: when too little input arrived it is padded with silence and
`received` says how much was real (an underrun). Input beyond one micro-turn is kept for the next
ones (surplus), up to a bound; past the bound the oldest samples are dropped and counted (an overrun),
because a client running ahead of real time must not grow memory or latency without limit.
"""

from collections import deque
from dataclasses import dataclass

import numpy as np

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
        self.max_samples = tick_samples * max_backlog_ticks
        self._parts: deque[Audio] = deque()
        self._head = 0  # samples of _parts[0] already consumed
        self.buffered = 0  # samples waiting
        self.dropped = 0  # samples dropped by the backlog bound, ever

    def push(self, audio: Audio) -> int:
        """Append samples; returns how many old samples were dropped to respect the bound."""
        if len(audio) == 0:
            return 0
        self._parts.append(np.asarray(audio, dtype=np.float32))
        self.buffered += len(audio)
        excess = self.buffered - self.max_samples
        if excess > 0:
            self._discard(excess)
            self.dropped += excess
            return excess
        return 0

    def ready(self) -> int:
        """How many whole micro-turns are buffered."""
        return self.buffered // self.tick_samples

    def pop(self) -> Chunk:
        """Take one micro-turn, padding with silence if fewer samples are buffered."""
        n = min(self.buffered, self.tick_samples)
        out = np.zeros(self.tick_samples, dtype=np.float32)
        filled = 0
        while filled < n:
            part = self._parts[0]
            take = min(n - filled, len(part) - self._head)
            out[filled : filled + take] = part[self._head : self._head + take]
            filled += take
            self._advance(take)
        return Chunk(out, n)

    def clear(self) -> int:
        """Drop everything buffered (e.g. input_audio_buffer.clear); returns samples dropped."""
        n = self.buffered
        self._parts.clear()
        self._head = 0
        self.buffered = 0
        return n

    def _discard(self, n: int) -> None:
        while n > 0:
            take = min(n, len(self._parts[0]) - self._head)
            self._advance(take)
            n -= take

    def _advance(self, n: int) -> None:
        self._head += n
        self.buffered -= n
        if self._head == len(self._parts[0]):
            self._parts.popleft()
            self._head = 0
