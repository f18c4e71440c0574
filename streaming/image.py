"""Still pictures at the transport edge: JPEG / PNG bytes -> a small RGB array, or a reason why not.

A client's picture (a Realtime `input_image`, or one frame of a WebSocket camera) is checked in order
of cost: its signature, then the size its header declares (so a small file declaring a huge picture is
refused before any pixel is decoded), then the full decode (a truncated or corrupt file fails here,
not later in a model). Callers run `decode_image` off the event loop: a 640x480 JPEG takes a few ms.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image

from streaming.video import Frame, fit_size

FORMATS = {"image/jpeg": "JPEG", "image/png": "PNG"}  # MIME type -> Pillow's format name
_SIGNATURES = {b"\xff\xd8\xff": "image/jpeg", b"\x89PNG\r\n\x1a\n": "image/png"}


class ImageError(ValueError):
    """A picture that cannot be used; `code` names why (an error event's code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def sniff(data: bytes) -> str | None:
    """The MIME type the bytes really are (JPEG or PNG), whatever they were labelled; None: neither."""
    for sig, mime in _SIGNATURES.items():
        if data.startswith(sig):
            return mime
    return None


def decode_image(data: bytes, max_pixels: int, max_side: int) -> Frame:
    """JPEG or PNG bytes -> uint8 RGB [H, W, 3], longest side <= max_side; ImageError otherwise."""
    mime = sniff(data)
    if mime is None:
        raise ImageError("invalid_image", "the data is not a JPEG or PNG picture")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=[FORMATS[mime]])
            w, h = img.size  # from the header: nothing decoded yet
            if w * h > max_pixels:
                raise ImageError("image_too_large", f"the picture is {w}x{h} ({w * h} pixels); the limit is "
                                 f"{max_pixels} pixels")
            img.load()  # the whole decode: truncated or corrupt data fails here
            rgb = img.convert("RGB")
    except ImageError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError("invalid_image", f"the {mime} picture cannot be decoded ({str(exc)[:120]})") from None
    tw, th = fit_size(w, h, max_side)
    if (tw, th) != (w, h):
        rgb = rgb.resize((tw, th), Image.Resampling.BILINEAR, reducing_gap=2.0)
    frame = np.asarray(rgb, dtype=np.uint8)
    assert frame.ndim == 3 and frame.shape[2] == 3, f"expected [H, W, 3] RGB, got {frame.shape}"
    return np.ascontiguousarray(frame)
