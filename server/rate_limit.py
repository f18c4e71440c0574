"""Token buckets: a burst, then a steady rate, per key (a client address, a session).

A bucket holds at most `burst` tokens and gains `rate` a second; taking one that is not there is
refused, with the seconds until one will be. Buckets per key live in a bounded map: a full bucket
carries no information (a new one would be full too), so when the map is at its bound the full ones
are forgotten first, and then the oldest; a client cannot grow it by using many keys.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_KEYS = 10_000  # client addresses remembered at once


class TokenBucket:
    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, got {rate}, {burst}")
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._at = float(burst), clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def take(self) -> float:
        """0.0 when a token was taken; else the seconds until one will be there (nothing taken)."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate

    def full(self) -> bool:
        self._refill()
        return self._tokens >= self.burst


class KeyedBuckets:
    """One `TokenBucket` per key, at most `max_keys` of them."""

    def __init__(self, rate: float, burst: float, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_keys, self._clock = rate, burst, max_keys, clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, key: str) -> float:
        """0.0 when `key` may go on; else the seconds it should wait."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget()
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, self._clock)
        self._buckets.move_to_end(key)
        return bucket.take()

    def _forget(self) -> None:
        for key in [k for k, b in self._buckets.items() if b.full()]:
            del self._buckets[key]
        while len(self._buckets) >= self.max_keys:
            self._buckets.popitem(last=False)

    def __len__(self) -> int:
        return len(self._buckets)


def retry_after(wait: float) -> str:
    """A Retry-After header's value (whole seconds, at least 1) for a wait in seconds."""
    return str(max(1, math.ceil(wait)))


# A session's own requests to the background reasoner, which every session shares: a few back to
# back (a question, its correction), then one every few seconds; a request answered takes longer.
BACKGROUND_REQUESTS_PER_MINUTE = 12.0
BACKGROUND_BURST = 3


def background_requests() -> TokenBucket:
    return TokenBucket(BACKGROUND_REQUESTS_PER_MINUTE / 60.0, BACKGROUND_BURST)
