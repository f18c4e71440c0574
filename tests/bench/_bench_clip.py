"""A generated sample cut to its first seconds, for the real-time runs of the fdbench tests: they check
where each micro-turn's output is placed, which the first speech and the silence after it show as well
as the whole clip does, and a real-time run lasts as long as its clip."""

from __future__ import annotations

from pathlib import Path

from streaming.types import TICK_SECONDS
from streaming.wav import read_wav, write_wav


def keep_first(wav: Path, seconds: float) -> int:
    """Cut `wav` to its first `seconds` (whole micro-turns) in place; returns the samples kept."""
    audio, rate = read_wav(wav)
    tick = round(rate * TICK_SECONDS)
    keep = int(seconds * rate) // tick * tick
    assert 0 < keep < len(audio), (wav, len(audio), keep)
    write_wav(wav, audio[:keep], rate)
    return keep
