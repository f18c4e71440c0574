"""Decoded audio frames (PyAV) <-> the server's mono float32 samples, for real-time transports.

WebRTC hands us Opus already decoded by aiortc: 20 ms `av.AudioFrame`s, usually s16 stereo 48 kHz.
`FrameToMono` converts any such frame to mono float32 at one rate (libswresample for the rate, its
filter state kept across frames so frame boundaries leave no clicks). `mono_to_frame` is the way
back, for output tracks: s16 mono frames, which aiortc's Opus encoder takes without another
resampling step when they are already at 48 kHz.
"""

from __future__ import annotations

import fractions

import av
import numpy as np

from streaming.resample import StreamResampler
from streaming.types import Audio


class FrameToMono:
    """Stateful converter: any av.AudioFrame (sample format, layout, rate) -> mono float32 at `rate`.

    Channels are averaged here rather than by libswresample, whose downmix matrix adds -3 dB per
    channel: two identical channels (what aiortc's decoder makes of mono Opus) would come out 3 dB
    louder than they went in.
    """

    def __init__(self, rate: int) -> None:
        if rate <= 0:
            raise ValueError(f"sample rate must be positive, got {rate}")
        self.rate = rate
        self._resampler: StreamResampler | None = None

    def convert(self, frame: av.AudioFrame) -> Audio:
        channels = len(frame.layout.channels)
        pcm = frame.to_ndarray()  # planar: [channels, samples]; packed: [1, samples * channels]
        data = pcm if frame.format.is_planar else pcm.reshape(-1, channels).T
        if np.issubdtype(data.dtype, np.integer):
            scale = float(2 ** (8 * data.dtype.itemsize - 1))  # full scale of a signed integer sample
            mono = data.astype(np.float32).mean(axis=0) / np.float32(scale)
        else:
            mono = data.astype(np.float32).mean(axis=0)
        if self._resampler is None or self._resampler.src_rate != frame.sample_rate:
            self._resampler = StreamResampler(frame.sample_rate, self.rate)
        return self._resampler.process(mono)


def mono_to_frame(audio: Audio, rate: int, pts: int) -> av.AudioFrame:
    """float32 mono samples in [-1, 1] -> an s16 mono av.AudioFrame stamped `pts` (in 1/rate units)."""
    pcm = np.clip(np.rint(np.asarray(audio, dtype=np.float32) * 32768.0), -32768, 32767).astype(np.int16)
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
    frame.sample_rate = rate
    frame.pts = pts
    frame.time_base = fractions.Fraction(1, rate)
    return frame
