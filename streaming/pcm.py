"""PCM16 <-> float32 conversion at the transport edge."""

import numpy as np
import numpy.typing as npt

from streaming.types import Audio


class PCMError(ValueError):
    """Raised for byte strings that are not whole little-endian 16-bit samples."""


def pcm16_to_float32(data: bytes) -> Audio:
    """Little-endian signed 16-bit samples -> float32 in [-1, 1)."""
    if len(data) % 2:
        raise PCMError(f"PCM16 payload has an odd number of bytes ({len(data)}); each sample is 2 bytes")
    ints = np.frombuffer(data, dtype="<i2")
    return ints.astype(np.float32) / np.float32(32768.0)


def float32_to_pcm16(audio: npt.NDArray[np.floating]) -> bytes:
    """float32 in [-1, 1] -> little-endian signed 16-bit samples, clipped and rounded.

    Rounding (not truncation) makes pcm16 -> float32 -> pcm16 an exact round trip, which the echo
    tests rely on to compare audio bit for bit.
    """
    scaled = np.clip(np.rint(np.asarray(audio, dtype=np.float32) * 32768.0), -32768, 32767)
    return scaled.astype("<i2").tobytes()
