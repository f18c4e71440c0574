"""The session's audio format at the edge: client bytes -> 24 kHz float32, and back.

GPT-Live fixes one format for both directions at start: PCM16 at 24 kHz (what the model runs at)
or 16 kHz, or G.711 mu-law / A-law at 8 kHz. Resamplers keep their filter state across chunks.
"""

from __future__ import annotations

import numpy as np

from server.live.events import LiveError
from streaming.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from streaming.pcm import float32_to_pcm16
from streaming.resample import StreamResampler
from streaming.types import SAMPLE_RATE, Audio


class LiveAudio:
    """One session's input decoder and output encoder for `format_type` at `rate`."""

    def __init__(self, format_type: str, rate: int) -> None:
        self.format_type, self.rate = format_type, rate
        resample = rate != SAMPLE_RATE
        self._in = StreamResampler(rate, SAMPLE_RATE) if resample else None
        self._out = StreamResampler(SAMPLE_RATE, rate) if resample else None

    def decode(self, data: bytes, eid: str | None) -> Audio:
        """Client bytes in the session's format -> float32 at 24 kHz."""
        if self.format_type == "audio/pcm":
            if len(data) % 2:
                raise LiveError("invalid_audio", f"decoded audio has {len(data)} bytes; audio/pcm is 16-bit "
                                "samples (an even number of bytes)", "audio", eid)
            ints = np.frombuffer(data, dtype="<i2")
        elif self.format_type == "audio/pcmu":
            ints = ulaw_decode(data)
        else:
            ints = alaw_decode(data)
        audio = ints.astype(np.float32) / np.float32(32768.0)
        return self._in.process(audio) if self._in is not None else audio

    def encode(self, audio: Audio) -> bytes:
        """float32 at 24 kHz -> bytes in the session's format."""
        if self._out is not None:
            audio = self._out.process(audio)
        pcm = float32_to_pcm16(audio)
        if self.format_type == "audio/pcm":
            return pcm
        ints = np.frombuffer(pcm, dtype="<i2")
        return ulaw_encode(ints) if self.format_type == "audio/pcmu" else alaw_encode(ints)

    def release(self) -> None:
        """Drop the resamplers now: each holds an FFmpeg filter graph with threads of its own."""
        self._in = self._out = None
