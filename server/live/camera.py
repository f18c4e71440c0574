"""duplex's camera extension on the GPT-Live socket: `duplex.input_video.append {image}`.

GPT-Live takes no pictures; a duplex client that asked for extensions (`X-Duplex-Extensions: 1` or the
subprotocol `duplex-extensions`, as on `/v1/realtime`) may send camera frames the way a Realtime client
does, with the same bounds: a base64 JPEG or PNG, at most VIDEO_FRAMES_PER_S on average, decoded on the
shared picture pool (server/pictures.py). Each bound hit is one `error` in GPT-Live's shape.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from server import protocol as p
from server.limits import VIDEO_FRAME_BURST, VIDEO_FRAMES_PER_S
from server.live.events import LiveError
from server.pictures import FrameRate, picture
from server.protocol import ProtocolError
from server.runtime import Runtime

EVENT = "duplex.input_video.append"


class LiveCamera:
    """One connection's camera: its rate bound and the decoding of each frame."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._rate = FrameRate(VIDEO_FRAMES_PER_S, VIDEO_FRAME_BURST)

    async def decode(self, image: Any, eid: str | None) -> np.ndarray:
        """`image` (base64) -> RGB [H, W, 3]; LiveError for a frame that is refused (the session goes on)."""
        try:
            data = p.decode_b64(image, "image", eid)
            if not self._rate.take(time.monotonic()):
                self.runtime.metrics.dropped_event("video_rate", "live")
                raise ProtocolError("video_rate_exceeded", f"camera frames are arriving faster than "
                                    f"{VIDEO_FRAMES_PER_S:g} a second; this one was dropped", "image", eid)
            return await picture(data, "image", eid)
        except ProtocolError as exc:
            raise LiveError(exc.code, exc.message, exc.param, eid) from None
