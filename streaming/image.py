"""Still pictures at the transport edge: JPEG / PNG bytes -> a small RGB array, or a reason why not.

A client's picture (a Realtime `input_image`, or one frame of a WebSocket camera) is checked in order
of cost: its signature, then what its header declares, then the decode. A small file can declare a
picture whose decoding costs far more than it is worth (a huge size; a progressive JPEG of thousands
of empty scans, each of which walks every block of the picture), so the header's size and, for a
JPEG, its coding process and number of scans are bounded before any pixel is decoded. A JPEG is then
decoded straight at a reduced scale (libjpeg's scaled IDCT, Pillow's `draft`), near the size
perception works at; a PNG has no reduced decode, so it gets a smaller pixel bound. A truncated or
corrupt file fails in the decode, not later in a model. Callers run `decode_image` off the event loop.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image

from streaming.video import Frame, fit_size

FORMATS = {"image/jpeg": "JPEG", "image/png": "PNG"}  # MIME type -> Pillow's format name
_SIGNATURES = {b"\xff\xd8\xff": "image/jpeg", b"\x89PNG\r\n\x1a\n": "image/png"}

# JPEG start-of-frame markers -> their coding process. Only the Huffman-coded DCT processes that
# cameras, phones and browsers write are decoded; lossless, hierarchical and arithmetic-coded JPEGs
# (which no browser shows) cost a full-size decode or more and are refused.
_SOF_TAKEN = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive"}
_SOF_REFUSED = {0xC3: "lossless", 0xC5: "hierarchical", 0xC6: "hierarchical", 0xC7: "hierarchical",
                0xC9: "arithmetic", 0xCA: "arithmetic", 0xCB: "arithmetic", 0xCD: "hierarchical",
                0xCE: "hierarchical", 0xCF: "hierarchical"}
_SOS, _EOI = 0xDA, 0xD9
EMBEDDED_SCANS = 4  # start-of-scan bytes allowed beyond the picture's own scans (EXIF thumbnail, MPF images)
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM and RST0-7 have no length field


@dataclass(frozen=True)
class Bounds:
    """What one picture may cost, judged before it is decoded from the size its header declares."""

    max_pixels: int  # any picture: a JPEG is decoded at a reduced scale, so this may be large
    max_full_pixels: int  # a picture decoded at full size (PNG): every pixel is inflated and unfiltered
    max_jpeg_scans: int  # libjpeg writes 6 (grey) to 10 (colour) scans in a progressive JPEG
    # Each scan of a JPEG walks every block of the picture, and a progressive JPEG keeps every
    # coefficient of the whole picture until its last scan: pixels x scans bounds both.
    max_jpeg_pixel_scans: int


# A 16-megapixel photo is taken as a baseline JPEG (decoded at 1/4 or 1/8 scale); a progressive one
# up to about 1920x1200 (10 scans), and so is a PNG.
DEFAULT_BOUNDS = Bounds(max_pixels=4096 * 4096, max_full_pixels=1920 * 1200, max_jpeg_scans=16,
                        max_jpeg_pixel_scans=1920 * 1200 * 10)


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


@dataclass(frozen=True)
class JpegLayout:
    """What a JPEG's markers say, read without decoding: its coding process and how many scans it has."""

    sof: int | None  # the start-of-frame marker (0xC0 baseline, 0xC2 progressive, ...); None: none seen
    scans: int  # start-of-scan markers counted (counting stops one past `stop_after`)


def jpeg_layout(data: bytes, stop_after: int) -> JpegLayout:
    """Walk a JPEG's markers (segments by their lengths, entropy-coded data to its next marker).

    Stops at the end of the image or once more than `stop_after` scans are seen: the answer is
    already "too many". Bytes that are not a marker are skipped to the next one, as the decoder does.
    """
    n, pos = len(data), 2  # past SOI
    sof: int | None = None
    scans = 0
    while pos + 1 < n:
        if data[pos] != 0xFF:  # stray bytes between segments: libjpeg skips them to the next marker too
            pos = data.find(b"\xff", pos)
            if pos < 0:
                break
            continue
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker == _EOI:
            break
        if marker in _STANDALONE or marker == 0x00:  # FF 00 outside a scan: discarded by libjpeg too
            pos += 2
            continue
        if pos + 3 >= n:
            break
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
        if sof is None and (marker in _SOF_TAKEN or marker in _SOF_REFUSED):
            sof = marker
        if marker != _SOS:
            continue
        scans += 1
        if scans > stop_after:
            break
        pos = _entropy_end(data, pos)
    return JpegLayout(sof, scans)


def _entropy_end(data: bytes, pos: int) -> int:
    """The position of the marker that ends the entropy-coded data starting at `pos` (len(data): none)."""
    n = len(data)
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= n:
            return n
        nxt = data[pos + 1]
        if nxt == 0x00 or 0xD0 <= nxt <= 0xD7:  # a stuffed 0xFF byte, a restart marker: still the scan
            pos += 2
        elif nxt == 0xFF:  # fill bytes: the marker is further on
            pos += 1
        else:
            return pos


def _check_jpeg(data: bytes, pixels: int, bounds: Bounds) -> None:
    most = max(1, min(bounds.max_jpeg_scans, bounds.max_jpeg_pixel_scans // pixels))
    layout = jpeg_layout(data, most)
    if layout.sof in _SOF_REFUSED:
        raise ImageError("unsupported_image_type", f"{_SOF_REFUSED[layout.sof]} JPEGs are not decoded here; send "
                         "a baseline or progressive JPEG, or a PNG")
    # Whatever the walk above concluded, libjpeg cannot read a scan whose marker bytes are not in the
    # file: their raw count bounds what it can decode (less a few for thumbnails and previews that
    # cameras embed in APP segments, each a JPEG of its own).
    if layout.scans > most or data.count(b"\xff\xda") - EMBEDDED_SCANS > most:
        raise ImageError("image_too_complex", f"the JPEG has more than {most} scans, the most decoded here at its "
                         "size; send a baseline JPEG (one scan) or a smaller picture")


def decode_image(data: bytes, max_pixels: int, max_side: int, bounds: Bounds | None = None) -> Frame:
    """JPEG or PNG bytes -> uint8 RGB [H, W, 3], longest side <= max_side; ImageError otherwise.

    `max_pixels` bounds every picture; `bounds` (DEFAULT_BOUNDS) adds the cost bounds above.
    """
    b = bounds or DEFAULT_BOUNDS
    max_pixels = min(max_pixels, b.max_pixels)
    mime = sniff(data)
    if mime is None:
        raise ImageError("invalid_image", "the data is not a JPEG or PNG picture")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=[FORMATS[mime]])
            w, h = img.size  # from the header: nothing decoded yet
            full_size = mime != "image/jpeg"  # only a JPEG can be decoded at a reduced scale
            limit = min(max_pixels, b.max_full_pixels) if full_size else max_pixels
            if w * h > limit:
                raise ImageError("image_too_large", f"the picture is {w}x{h} ({w * h} pixels); the limit is "
                                 f"{limit} pixels" + (" for a PNG" if full_size and limit < max_pixels else ""))
            tw, th = fit_size(w, h, max_side)
            if not full_size:
                _check_jpeg(data, w * h, b)
                img.draft("RGB", (tw, th))  # libjpeg decodes at 1/2, 1/4 or 1/8 scale, no smaller than asked
            img.load()  # the whole decode: truncated or corrupt data fails here
            rgb = img.convert("RGB")
    except ImageError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError("invalid_image", f"the {mime} picture cannot be decoded ({str(exc)[:120]})") from None
    if rgb.size != (tw, th):
        rgb = rgb.resize((tw, th), Image.Resampling.BILINEAR, reducing_gap=2.0)
    frame = np.asarray(rgb, dtype=np.uint8)
    assert frame.ndim == 3 and frame.shape[2] == 3, f"expected [H, W, 3] RGB, got {frame.shape}"
    return np.ascontiguousarray(frame)
