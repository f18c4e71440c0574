"""G.711: every 16-bit sample and every byte, against the standard's reference values."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

from streaming.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

EVERY_SAMPLE = np.arange(-32768, 32768, dtype=np.int16)
EVERY_BYTE = bytes(range(256))


def _audioop():  # type: ignore[no-untyped-def]
    """CPython's own G.711 (C, removed in 3.13): an independent implementation to agree with."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return importlib.import_module("audioop")
        except ModuleNotFoundError:
            pytest.skip("audioop is not in this Python (removed in 3.13)")


def test_every_sample_and_byte_matches_audioop() -> None:
    ref = _audioop()
    pcm = EVERY_SAMPLE.tobytes()
    assert ulaw_encode(EVERY_SAMPLE) == ref.lin2ulaw(pcm, 2)
    assert alaw_encode(EVERY_SAMPLE) == ref.lin2alaw(pcm, 2)
    assert ulaw_decode(EVERY_BYTE).tobytes() == ref.ulaw2lin(EVERY_BYTE, 2)
    assert alaw_decode(EVERY_BYTE).tobytes() == ref.alaw2lin(EVERY_BYTE, 2)


def test_silence_and_extremes_have_the_standard_codes() -> None:
    # Digital silence is 0xFF in mu-law and 0xD5 in A-law (the codes a telephone line idles on).
    assert ulaw_encode(np.zeros(3, np.int16)) == b"\xff\xff\xff"
    assert alaw_encode(np.zeros(3, np.int16)) == b"\xd5\xd5\xd5"
    assert ulaw_decode(b"\x80\x00").tolist() == [32124, -32124]
    assert alaw_decode(b"\xaa\x2a").tolist() == [32256, -32256]


@pytest.mark.parametrize(("encode", "decode"), [(ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)])
def test_coding_is_idempotent_and_close(encode, decode) -> None:  # type: ignore[no-untyped-def]
    levels = decode(EVERY_BYTE)
    assert decode(encode(levels)).tolist() == levels.tolist(), "a decoded level encodes to itself"
    back = decode(encode(EVERY_SAMPLE)).astype(np.int32)
    err = np.abs(back - EVERY_SAMPLE.astype(np.int32))
    # Companding keeps the error within half a step of the segment: about 3 % of the magnitude.
    assert np.all(err <= np.maximum(16, np.abs(EVERY_SAMPLE.astype(np.int32)) * 0.07))
