"""Video frames at the transport edge: decoded frames (PyAV) -> small RGB arrays for the model.

Models see at most a few 40x40 patches of the newest frame per micro-turn (the native model resizes
to (grid * 40)^2, at most 160x160), so a camera frame is shrunk right away: keeping 720p frames around
would only cost memory and conversion time. swscale does the resize and the colour conversion in one
pass; callers run `downscale` off the event loop (it takes a few ms for a 720p frame).
"""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt

MAX_SIDE = 320  # longest side kept; above what any model here consumes, small enough to be cheap

Frame = npt.NDArray[np.uint8]  # [H, W, 3] RGB


def fit_size(width: int, height: int, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """(w, h) scaled so the longest side is at most max_side, aspect kept, both even and >= 2.

    Even sizes because some swscale paths from yuv420p (chroma subsampled by 2) need them.
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"frame size must be positive, got {width}x{height}")
    scale = min(1.0, max_side / max(width, height))
    w = max(2, round(width * scale / 2) * 2)
    h = max(2, round(height * scale / 2) * 2)
    return w, h


def downscale(frame: av.VideoFrame, max_side: int = MAX_SIDE) -> Frame:
    """Any decoded video frame -> uint8 RGB [H, W, 3] with its longest side <= max_side."""
    w, h = fit_size(frame.width, frame.height, max_side)
    small = frame.reformat(width=w, height=h, format="rgb24", interpolation="AREA")
    rgb = small.to_ndarray()  # [h, w, 3]
    assert rgb.shape == (h, w, 3), f"expected [{h}, {w}, 3] RGB, got {rgb.shape}"
    return np.ascontiguousarray(rgb, dtype=np.uint8)
