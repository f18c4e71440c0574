"""Pictures from a client (Realtime `input_image` parts, the WebSocket camera): a rate bound and decoding.

Decoding runs off the event loop (streaming/image.py checks the size a file's header claims before it
decodes anything); every bound that is hit is a `ProtocolError` naming it, so the session goes on.
"""

from __future__ import annotations

import asyncio

import numpy as np

from server.limits import IMAGE_MAX_SIDE, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from server.protocol import ProtocolError
from streaming.image import ImageError, decode_image


class FrameRate:
    """A token bucket: `rate` frames a second on average, bursts of `burst`; `take(now)` False: too fast."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens = float(burst)
        self.at: float | None = None

    def take(self, now: float) -> bool:
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


async def picture(data: bytes, param: str, event_id: str | None) -> np.ndarray:
    """JPEG / PNG bytes -> RGB [H, W, 3] (longest side IMAGE_MAX_SIDE), decoded off the event loop."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ProtocolError("image_too_large", f"the picture has {len(data)} bytes; the limit is {MAX_IMAGE_BYTES}",
                            param, event_id)
    try:
        return await asyncio.to_thread(decode_image, data, MAX_IMAGE_PIXELS, IMAGE_MAX_SIDE)
    except ImageError as exc:
        raise ProtocolError(exc.code, str(exc), param, event_id) from None
