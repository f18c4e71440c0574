"""Pictures from a client (Realtime `input_image` parts, the WebSocket camera): a rate bound and decoding.

Decoding runs on the picture pool's own threads (server/picture_pool.py: one picture per session, a
bounded queue), after streaming/image.py has judged from the file's header what decoding it would
cost; every bound that is hit is a `ProtocolError` naming it, so the session goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import numpy as np

from server.limits import IMAGE_MAX_SIDE, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from server.picture_pool import PicturePool, PoolFull, shared_pool
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


async def picture(data: bytes, param: str, event_id: str | None, owner: Hashable | None = None,
                  pool: PicturePool | None = None) -> np.ndarray:
    """JPEG / PNG bytes -> RGB [H, W, 3] (longest side IMAGE_MAX_SIDE), decoded on the picture pool.

    `owner` is who may have one picture in the pool at a time: by default the calling task (a
    connection reads its messages in one task, so this is its session).
    """
    if len(data) > MAX_IMAGE_BYTES:
        raise ProtocolError("image_too_large", f"the picture has {len(data)} bytes; the limit is {MAX_IMAGE_BYTES}",
                            param, event_id)
    try:
        return await (pool or shared_pool()).run(owner if owner is not None else asyncio.current_task(),
                                                 decode_image, data, MAX_IMAGE_PIXELS, IMAGE_MAX_SIDE)
    except (ImageError, PoolFull) as exc:
        raise ProtocolError(exc.code, str(exc), param, event_id) from None
