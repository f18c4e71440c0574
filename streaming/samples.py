"""A bounded first-in first-out queue of audio samples.

The input chunker (arbitrary frames in, 200 ms micro-turns out) and the output pacer (micro-turns in,
20 ms frames out) both buffer a stream of float32 samples that arrives in pieces of one size and leaves
in pieces of another. Pieces are kept as pushed, not concatenated, so a push costs no copy of what is
already queued; reads copy only what they take.

Past `max_samples` the oldest samples are dropped and counted: a producer running ahead of its consumer
must not grow memory or latency without limit.
"""

from collections import deque

import numpy as np

from streaming.types import Audio


class SampleQueue:
    def __init__(self, max_samples: int) -> None:
        if max_samples < 0:
            raise ValueError(f"max_samples must not be negative, got {max_samples}")
        self.max_samples = max_samples  # bound on samples waiting
        self.dropped = 0  # samples dropped by the bound, ever (clear() does not count here)
        self._parts: deque[Audio] = deque()  # pushed pieces, oldest first
        self._head = 0  # samples of _parts[0] already taken
        self._size = 0  # samples waiting

    def __len__(self) -> int:
        return self._size

    def push(self, audio: Audio) -> int:
        """Append samples; returns how many of the oldest were dropped to respect the bound."""
        if len(audio) == 0:
            return 0
        self._parts.append(np.asarray(audio, dtype=np.float32))
        self._size += len(audio)
        excess = self._size - self.max_samples
        if excess <= 0:
            return 0
        self._take(excess, None)
        self.dropped += excess
        return excess

    def pop_into(self, out: Audio) -> int:
        """Move the oldest samples into the start of `out`, as many as fit and are queued; returns how many.

        The rest of `out` is left as it was (callers pass zeros: a silence-padded read).
        """
        n = min(self._size, len(out))
        self._take(n, out)
        return n

    def clear(self) -> int:
        """Drop everything queued; returns how many samples that was."""
        n = self._size
        self._parts.clear()
        self._head = 0
        self._size = 0
        return n

    def _take(self, n: int, out: Audio | None) -> None:
        """Remove the oldest n samples (n <= len(self)), copying them into `out` when given."""
        filled = 0
        while filled < n:
            part = self._parts[0]
            take = min(n - filled, len(part) - self._head)
            if out is not None:
                out[filled : filled + take] = part[self._head : self._head + take]
            filled += take
            self._head += take
            self._size -= take
            if self._head == len(part):
                self._parts.popleft()
                self._head = 0
