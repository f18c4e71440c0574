"""What the cascade test modules (test_cascade*.py) share within a test process, so that each is paid once.

- `speech`: Piper's rendering of a text, synthesised once per process (the same sentences are spoken in
  many tests: "Tell me about Paris." alone ~15 times). The arrays are read-only: a test that scales
  one must copy it first.
- `sphinx_cascade`: the cascade without Whisper (`asr=sphinx`: no overlap probe, no overlap words, no
  Whisper transcripts), loaded once per process for the tests that compare against it, and shut down
  when pytest ends. Loading it (recogniser processes, Smart Turn, Piper's pre-rendered phrases) took
  each such test ~5 s on an idle machine and 15-20 s on a loaded one.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from models.cascade import CascadeModel, load_cascade
from models.speech.tts import synthesize
from streaming.resample import resample
from streaming.types import SAMPLE_RATE


@functools.cache
def speech(text: str) -> np.ndarray:
    """`text` in the default voice at the model's input rate (read-only; cached per process)."""
    audio, sr = synthesize(text)
    x = resample(audio, sr, SAMPLE_RATE)
    x.setflags(write=False)
    return x


_sphinx: list[CascadeModel] = []


def sphinx_cascade(config: pytest.Config) -> CascadeModel:
    """A cascade loaded with `asr=sphinx`, one per test process (shut down when pytest ends, with
    `config`); sessions are per test, as with `default_cascade`."""
    if not _sphinx:
        _sphinx.append(load_cascade("asr=sphinx"))
        config.add_cleanup(_shut_sphinx)
    return _sphinx[0]


def _shut_sphinx() -> None:
    _sphinx.pop().shutdown()  # and let it go before the interpreter's exit, as fixtures' models are
