"""Sample-rate conversion with libswresample (PyAV).

Transports convert at the edge: Opus arrives at 48 kHz, clients may send 16 kHz, VAD/ASR want 16 kHz.
`StreamResampler` keeps filter state across calls so chunk boundaries leave no clicks; `resample` is
the one-shot form for whole clips.
"""

import av
import numpy as np

from streaming.types import Audio


class StreamResampler:
    """Stateful mono float32 resampler; feed chunks of any size, get converted chunks back.

    The converter holds back a few samples of filter delay; `flush()` returns them at end of stream.
    """

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        if src_rate <= 0 or dst_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {src_rate} -> {dst_rate}")
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self._pts = 0
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=dst_rate)

    def process(self, audio: Audio) -> Audio:
        if self.src_rate == self.dst_rate:
            return np.asarray(audio, dtype=np.float32)
        if len(audio) == 0:
            return np.zeros(0, dtype=np.float32)
        # PyAV wants [channels, samples] for packed float32 mono.
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(audio, dtype=np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate = self.src_rate
        frame.pts = self._pts
        self._pts += len(audio)
        return self._collect(self._resampler.resample(frame))

    def flush(self) -> Audio:
        if self.src_rate == self.dst_rate:
            return np.zeros(0, dtype=np.float32)
        return self._collect(self._resampler.resample(None))

    @staticmethod
    def _collect(frames: list[av.AudioFrame]) -> Audio:
        if not frames:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32)


def resample(audio: Audio, src_rate: int, dst_rate: int) -> Audio:
    """Resample a whole clip; the result has round(len * dst / src) samples."""
    if src_rate == dst_rate:
        return np.asarray(audio, dtype=np.float32)
    rs = StreamResampler(src_rate, dst_rate)
    out = np.concatenate([rs.process(audio), rs.flush()])
    want = round(len(audio) * dst_rate / src_rate)
    # swresample may emit a sample more or less than the exact ratio; fix the length so callers
    # can rely on timelines lining up.
    if len(out) >= want:
        return out[:want]
    return np.concatenate([out, np.zeros(want - len(out), dtype=np.float32)])
