"""G.711 companding (ITU-T G.711: mu-law and A-law), the telephone network's 8 kHz audio.

One byte per sample, pure numpy, exact to the standard's tables: both encoders map a 16-bit linear
sample to the byte whose decoded value the reference C code (Sun's g711.c, which CPython's old
`audioop` also implemented) picks, so a call leg can be re-encoded without drift. Decoding is a
256-entry table lookup; encoding is a 65,536-entry one, built once on first use (64 kB each).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import numpy.typing as npt

_ULAW_BIAS = 0x84  # on the 16-bit scale; added before the segment search so the segments start at zero
_ULAW_CLIP = 8159  # the largest 14-bit magnitude mu-law represents
# Upper bounds of the mu-law segments, on the 14-bit scale (biased) the standard defines mu-law on.
_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
# Upper bounds of the A-law segments, on the 13-bit scale the standard defines A-law on.
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)


def _ulaw_encode_exact(pcm: npt.NDArray[np.int32]) -> npt.NDArray[np.uint8]:
    """mu-law bytes of 16-bit samples held in int32 (vectorised reference algorithm)."""
    val = pcm >> 2  # mu-law is defined on 14 bits
    mask = np.where(val < 0, 0x7F, 0xFF).astype(np.int32)  # the sign, and mu-law's inverted bits
    val = np.minimum(np.abs(val), _ULAW_CLIP) + (_ULAW_BIAS >> 2)  # [N] 33..8192
    seg = np.searchsorted(_ULAW_SEG_END, val, side="left").astype(np.int32)  # first bound >= val
    uval = (np.minimum(seg, 7) << 4) | ((val >> (seg + 1)) & 0x0F)
    uval = np.where(seg >= 8, 0x7F, uval)
    return ((uval ^ mask) & 0xFF).astype(np.uint8)


def _alaw_encode_exact(pcm: npt.NDArray[np.int32]) -> npt.NDArray[np.uint8]:
    """A-law bytes of 16-bit samples held in int32 (vectorised reference algorithm)."""
    val = pcm >> 3  # A-law is defined on 13 bits
    mask = np.where(val >= 0, 0xD5, 0x55).astype(np.int32)  # sign and even-bit inversion in one
    val = np.where(val >= 0, val, -val - 1)
    seg = np.searchsorted(_ALAW_SEG_END, val, side="left").astype(np.int32)  # first bound >= val; 8 past them
    shift = np.where(seg < 2, 1, seg)
    aval = (np.minimum(seg, 7) << 4) | ((val >> shift) & 0x0F)
    aval = np.where(seg >= 8, 0x7F, aval)  # past the last segment: the largest magnitude
    return ((aval ^ mask) & 0xFF).astype(np.uint8)


def _ulaw_decode_exact(codes: npt.NDArray[np.int32]) -> npt.NDArray[np.int16]:
    u = ~codes & 0xFF
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


def _alaw_decode_exact(codes: npt.NDArray[np.int32]) -> npt.NDArray[np.int16]:
    a = codes ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, t + 0x108)
    t = np.where(seg > 1, t << np.maximum(seg - 1, 0), t)
    return np.where(a & 0x80, t, -t).astype(np.int16)


@cache
def _tables(law: str) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int16]]:
    """(encode table indexed by int16 + 32768, decode table indexed by the byte) of one law."""
    linear = np.arange(-32768, 32768, dtype=np.int32)
    codes = np.arange(256, dtype=np.int32)
    if law == "ulaw":
        return _ulaw_encode_exact(linear), _ulaw_decode_exact(codes)
    return _alaw_encode_exact(linear), _alaw_decode_exact(codes)


def _encode(pcm: npt.NDArray[np.int16], law: str) -> bytes:
    table, _ = _tables(law)
    return table[np.asarray(pcm, dtype=np.int16).astype(np.int32) + 32768].tobytes()


def _decode(data: bytes, law: str) -> npt.NDArray[np.int16]:
    _, table = _tables(law)
    return table[np.frombuffer(data, dtype=np.uint8)]


def ulaw_encode(pcm: npt.NDArray[np.int16]) -> bytes:
    """16-bit linear samples -> mu-law bytes (one per sample)."""
    return _encode(pcm, "ulaw")


def ulaw_decode(data: bytes) -> npt.NDArray[np.int16]:
    """mu-law bytes -> 16-bit linear samples."""
    return _decode(data, "ulaw")


def alaw_encode(pcm: npt.NDArray[np.int16]) -> bytes:
    """16-bit linear samples -> A-law bytes (one per sample)."""
    return _encode(pcm, "alaw")


def alaw_decode(data: bytes) -> npt.NDArray[np.int16]:
    """A-law bytes -> 16-bit linear samples."""
    return _decode(data, "alaw")
