"""Decoded audio frames (PyAV) <-> the server's mono float32 samples, for real-time transports.

WebRTC hands us Opus already decoded by aiortc: 20 ms `av.AudioFrame`s, usually s16 stereo 48 kHz.
`FrameToMono` converts any such frame to mono float32 at one rate with libswresample, keeping the
filter state across frames so frame boundaries leave no clicks. `mono_to_frame` is the way back, for
output tracks: s16 mono frames, which aiortc's Opus encoder takes without another resampling step
when they are already at 48 kHz.
"""

from __future__ import annotations

import fractions

import av
import numpy as np

from streaming.pcm import Audio


class FrameToMono:
    """Stateful converter: any av.AudioFrame (format, layout, rate) -> mono float32 at `rate`."""

    def __init__(self, rate: int) -> None:
        if rate <= 0:
            raise ValueError(f"sample rate must be positive, got {rate}")
        self.rate = rate
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)

    def convert(self, frame: av.AudioFrame) -> Audio:
        out = self._resampler.resample(frame)
        if not out:
            return np.zeros(0, dtype=np.float32)
        # Packed float mono: each frame's ndarray is [1, samples].
        return np.concatenate([f.to_ndarray().reshape(-1) for f in out]).astype(np.float32, copy=False)


def mono_to_frame(audio: Audio, rate: int, pts: int) -> av.AudioFrame:
    """float32 mono samples in [-1, 1] -> an s16 mono av.AudioFrame stamped `pts` (in 1/rate units)."""
    pcm = np.clip(np.rint(np.asarray(audio, dtype=np.float32) * 32768.0), -32768, 32767).astype(np.int16)
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
    frame.sample_rate = rate
    frame.pts = pts
    frame.time_base = fractions.Fraction(1, rate)
    return frame
