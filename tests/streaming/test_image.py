"""Client pictures cost no more than they are worth: what a JPEG or PNG header declares is judged first.

The hostile pictures here are built the way an attacker would build them: a progressive JPEG padded
with thousands of empty scans (each one walks every block of a 4096x4096 picture), a large PNG (it has
no reduced decode), a JPEG of a coding process no browser writes. Each is refused before a pixel is
decoded, in well under a millisecond of CPU; the pictures real clients send are still decoded.
"""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from PIL import Image

from streaming.image import DEFAULT_BOUNDS, ImageError, decode_image, jpeg_layout

MAX_PIXELS, MAX_SIDE = 4096 * 4096, 640


def encode(img: Image.Image, fmt: str, **options: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **options)
    return buf.getvalue()


def photo(w: int, h: int) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb)


def _scans(data: bytes) -> list[bytes]:
    """The scans of a JPEG written by Pillow (SOS header and entropy-coded data), in order."""
    out, pos = [], data.index(b"\xff\xda")
    while True:
        nxt = data.find(b"\xff\xda", pos + 2)  # a scan's data holds no 0xFF 0xDA (0xFF is stuffed)
        if nxt < 0:
            out.append(data[pos:-2])  # up to the EOI
            return out
        out.append(data[pos:nxt])
        pos = nxt


def empty_scans_jpeg(size: int = 4096, total_bytes: int = 185_000) -> bytes:
    """The review's picture: a flat progressive JPEG of `size` squared, its shortest AC scan (an empty
    EOB run, a few dozen bytes) repeated until the file is `total_bytes` long."""
    data = encode(Image.new("L", (size, size), 128), "JPEG", progressive=True, quality=90)
    ac = [s for s in _scans(data) if s[5 + 2 * s[4]] > 0]  # Ss > 0: an AC scan
    pad = min(ac, key=len)
    return data[:-2] + pad * ((total_bytes - len(data)) // len(pad)) + b"\xff\xd9"


def _refused(data: bytes, code: str) -> float:
    """Decode `data`, expect ImageError `code`; the CPU seconds it took."""
    t0 = time.process_time()
    with pytest.raises(ImageError) as err:
        decode_image(data, MAX_PIXELS, MAX_SIDE)
    assert err.value.code == code, err.value
    return time.process_time() - t0


def test_empty_scans_jpeg_refused_before_decoding() -> None:
    data = empty_scans_jpeg()
    assert 180_000 < len(data) <= 185_000
    assert jpeg_layout(data, 10_000).scans > 3000
    cpu = _refused(data, "image_too_complex")
    assert cpu < 0.05, f"refusing it took {cpu:.3f} s of CPU: it was decoded"  # decoding it takes seconds


def test_stray_bytes_between_scans_do_not_hide_them() -> None:
    """libjpeg skips bytes that are not a marker and decodes the scans after them: so does the count."""
    data = empty_scans_jpeg()
    first = _scans(data)[0]
    at = data.index(first) + len(first)
    _refused(data[:at] + b"\x00\x01" + data[at:], "image_too_complex")
    # FF 00 between segments is discarded, not a marker with a length that would jump over the scans.
    _refused(data[:at] + b"\xff\x00\xff\xff" + data[at:], "image_too_complex")


def test_start_of_scan_bytes_anywhere_bound_the_scans() -> None:
    """However the markers are read, a scan libjpeg decodes has its FF DA bytes in the file."""
    base = encode(photo(640, 480), "JPEG")
    comment = b"\xff\xda" * 40
    hidden = base[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + base[2:]
    assert jpeg_layout(hidden, 99).scans == 1, "the walk skips a comment"
    _refused(hidden, "image_too_complex")


def test_scans_are_counted_in_the_markers_not_in_the_bytes() -> None:
    base = photo(320, 240)
    assert jpeg_layout(encode(base, "JPEG"), 99).scans == 1
    prog = encode(base, "JPEG", progressive=True)
    assert jpeg_layout(prog, 99).scans == 10  # libjpeg's progression for colour
    assert jpeg_layout(prog, 3).scans == 4, "counting stops one past the bound"
    # An EXIF thumbnail is a whole JPEG (with its own scan) inside an APP1 segment: skipped by length.
    thumb = encode(photo(64, 48), "JPEG")
    exif = Image.Exif()
    with_thumb = encode(base, "JPEG", exif=exif.tobytes() + thumb)
    assert with_thumb.count(b"\xff\xda") == 2
    assert jpeg_layout(with_thumb, 99).scans == 1
    assert decode_image(prog, MAX_PIXELS, MAX_SIDE).shape == (240, 320, 3)


def test_progressive_jpeg_bounded_by_pixels_times_scans() -> None:
    # A legal 10-scan progressive JPEG of 4096x4096 keeps 100 MB of coefficients: refused from its markers.
    big = encode(Image.new("RGB", (4096, 4096), (90, 120, 200)), "JPEG", progressive=True, subsampling=0)
    assert _refused(big, "image_too_complex") < 0.05
    # The same as a baseline JPEG (one scan) is decoded, at a reduced scale, to perception's size.
    flat = encode(Image.new("RGB", (4096, 4096), (90, 120, 200)), "JPEG", quality=90)
    frame = decode_image(flat, MAX_PIXELS, MAX_SIDE)
    assert frame.shape == (640, 640, 3)
    assert np.abs(frame.astype(int) - [90, 120, 200]).max() <= 3
    # Progressive up to the bound: a 1920x1080 photo from a web page.
    assert decode_image(encode(photo(1920, 1080), "JPEG", progressive=True), MAX_PIXELS, MAX_SIDE).shape == \
        (360, 640, 3)


def test_png_has_a_smaller_bound_than_jpeg() -> None:
    over = 2560, 1600  # a few kB of PNG, over the bound for pictures decoded at full size
    assert over[0] * over[1] > DEFAULT_BOUNDS.max_full_pixels
    png = encode(Image.new("RGBA", over, (1, 2, 3, 4)), "PNG")
    assert len(png) < 30_000
    _refused(png, "image_too_large")
    assert decode_image(encode(photo(*over), "JPEG"), MAX_PIXELS, MAX_SIDE).shape == (400, 640, 3)
    assert decode_image(encode(photo(1920, 1080), "PNG"), MAX_PIXELS, MAX_SIDE).shape == (360, 640, 3)


@pytest.mark.parametrize("sof", [0xC3, 0xC9, 0xCA])
def test_jpeg_processes_browsers_do_not_write_are_refused(sof: int) -> None:
    """Lossless (no reduced decode) and arithmetic-coded JPEGs: refused from their frame marker."""
    data = bytearray(encode(photo(64, 48), "JPEG"))
    at = data.index(b"\xff\xc0")
    data[at + 1] = sof
    _refused(bytes(data), "unsupported_image_type")
