"""wav read/write (soundfile), always returning mono float32."""

from pathlib import Path

import numpy as np
import soundfile as sf

from streaming.resample import resample
from streaming.types import Audio


def read_wav(path: str | Path, rate: int | None = None) -> tuple[Audio, int]:
    """Read any soundfile-readable file as mono float32; resample to `rate` when given."""
    data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    mono = data.mean(axis=1).astype(np.float32) if data.shape[1] > 1 else data[:, 0]
    if rate is not None and rate != sr:
        return resample(mono, sr, rate), rate
    return np.ascontiguousarray(mono), sr


def write_wav(path: str | Path, audio: Audio, rate: int, subtype: str = "PCM_16") -> None:
    """Write mono audio; 16-bit PCM by default (what Full-Duplex-Bench expects)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0), rate, subtype=subtype)
