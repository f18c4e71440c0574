"""streaming/: PCM conversion, resampling, chunking and deadlines."""

from __future__ import annotations

import numpy as np
import pytest

from streaming.chunker import Chunker
from streaming.clock import DeadlineClock
from streaming.pcm import PCMError, float32_to_pcm16, pcm16_to_float32
from streaming.resample import StreamResampler, resample
from streaming.wav import read_wav, write_wav


def test_pcm16_round_trip_is_exact() -> None:
    ints = np.arange(-32768, 32768, 7, dtype="<i2")
    assert float32_to_pcm16(pcm16_to_float32(ints.tobytes())) == ints.tobytes()


def test_pcm16_clips_and_rejects_odd_lengths() -> None:
    assert np.frombuffer(float32_to_pcm16(np.array([2.0, -2.0], np.float32)), "<i2").tolist() == [32767, -32768]
    with pytest.raises(PCMError, match="odd number of bytes"):
        pcm16_to_float32(b"\x00\x01\x02")


def _tone(freq: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _peak_hz(x: np.ndarray, rate: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec) * rate / len(x))


@pytest.mark.parametrize(("src", "dst"), [(48000, 24000), (16000, 24000), (24000, 16000), (8000, 24000)])
def test_resample_keeps_pitch_and_length(src: int, dst: int) -> None:
    y = resample(_tone(440.0, src), src, dst)
    assert len(y) == dst
    assert abs(_peak_hz(y, dst) - 440.0) < 2.0
    # A band-limited resampler leaves little energy off the tone (a linear interpolator would not).
    assert 0.3 < float(np.sqrt(np.mean(y[1000:-1000] ** 2))) < 0.4


def test_streaming_resampler_matches_one_shot_in_chunks() -> None:
    x = _tone(1000.0, 48000, 0.5)
    rs = StreamResampler(48000, 24000)
    pieces = [rs.process(x[i : i + 960]) for i in range(0, len(x), 960)] + [rs.flush()]
    streamed = np.concatenate(pieces)
    assert abs(len(streamed) - 12000) <= 32
    whole = resample(x, 48000, 24000)
    n = min(len(streamed), len(whole)) - 100
    assert np.max(np.abs(streamed[100:n] - whole[100:n])) < 1e-3


def test_chunker_pads_carries_surplus_and_bounds_backlog() -> None:
    ch = Chunker(tick_samples=4, max_backlog_ticks=2)
    ch.push(np.arange(1, 4, dtype=np.float32))  # 3 samples: an underrun
    c = ch.pop()
    assert c.received == 3 and c.audio.tolist() == [1, 2, 3, 0]
    ch.push(np.arange(10, 16, dtype=np.float32))  # 6 samples: one tick + surplus
    assert ch.ready() == 1
    assert ch.pop().audio.tolist() == [10, 11, 12, 13]
    assert ch.pop().audio.tolist() == [14, 15, 0, 0]
    dropped = ch.push(np.arange(100, 111, dtype=np.float32))  # 11 > bound of 8: oldest 3 dropped
    assert dropped == 3 and ch.dropped == 3 and ch.buffered == 8
    assert ch.pop().audio.tolist() == [103, 104, 105, 106]
    assert ch.clear() == 4 and ch.buffered == 0


def test_deadline_clock_does_not_drift() -> None:
    fake = [100.0]
    clock = DeadlineClock(0.2, now=lambda: fake[0])
    assert clock.deadline(50) == pytest.approx(110.0)
    fake[0] = 103.05
    assert clock.index_at(fake[0]) == 16
    assert clock.lateness(15) == pytest.approx(0.05)


async def test_deadline_clock_sleeps_to_absolute_times() -> None:
    clock = DeadlineClock(0.02)
    lateness = [await clock.sleep_until(n) for n in range(1, 11)]
    # Each wake-up is measured against t0 + n * period, so a late wake-up is not carried forward.
    assert clock.lateness(10) >= 0
    assert max(lateness) < 0.2


def test_wav_round_trip(tmp_path) -> None:
    x = _tone(300.0, 16000, 0.25)
    write_wav(tmp_path / "a.wav", x, 16000)
    y, sr = read_wav(tmp_path / "a.wav")
    assert sr == 16000 and len(y) == len(x) and np.max(np.abs(x - y)) < 1e-4
    z, sr2 = read_wav(tmp_path / "a.wav", rate=24000)
    assert sr2 == 24000 and len(z) == 6000
