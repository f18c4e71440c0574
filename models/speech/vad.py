"""Silero voice activity detection: a shared ONNX model, per-session streaming state, batched steps.

The weights are the ONNX export shipped inside the `silero-vad` PyPI package; they are read with
onnxruntime directly, so importing this module does not import torch. The model scores 32 ms windows
(512 samples at 16 kHz, plus 64 samples of left context) and carries a recurrent state [2, B, 128]
between windows, so one `SileroVAD` instance serves any number of sessions: each session owns its
`VADStream` (state, context, leftover samples) and `SileroVAD.step` runs all sessions' windows as
one batch per window position.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from models.speech.shared import Shared
from streaming.resample import StreamResampler, resample
from streaming.types import Audio

VAD_RATE = 16_000
WINDOW = 512  # samples per scored window at 16 kHz (32 ms); fixed by the model
CONTEXT = 64  # samples of the previous window the model sees in front of each window
WINDOW_SECONDS = WINDOW / VAD_RATE
_MODEL_FILE = "silero_vad_16k_op15.onnx"


class VADError(RuntimeError):
    """The Silero weights could not be found or loaded."""


def _model_path() -> Path:
    # find_spec locates the package without executing its __init__ (which imports torch).
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise VADError("the `silero-vad` package is not installed; `pip install silero-vad` ships the weights")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / _MODEL_FILE
    if not path.exists():
        raise VADError(f"silero-vad is installed but {path} is missing; reinstall `silero-vad>=5.1`")
    return path


@dataclass
class VADStream:
    """One session's streaming VAD state. Create with `SileroVAD.open`; feed 24 kHz ticks to `step`."""

    resampler: StreamResampler  # 24 kHz input -> 16 kHz, keeps filter state across ticks
    pending: Audio  # 16 kHz samples not yet scored (fewer than one window after each step)
    context: Audio  # [CONTEXT] last samples of the previous window
    state: npt.NDArray[np.float32]  # [2, 128] recurrent state
    windows: int = 0  # windows scored so far (the stream's clock, 32 ms per window)

    def reset(self) -> None:
        """Forget the past (e.g. after a long gap); the resampler keeps its few samples of delay."""
        self.pending, self.context, self.state = _fresh()


def _fresh() -> tuple[Audio, Audio, npt.NDArray[np.float32]]:
    return (
        np.zeros(0, dtype=np.float32),
        np.zeros(CONTEXT, dtype=np.float32),
        np.zeros((2, 128), dtype=np.float32),
    )


class SileroVAD:
    """The shared Silero model. Thread-safe: `step` holds a lock around the ONNX session."""

    def __init__(self, threads: int = 1) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # The engine steps many sessions on few cores: one thread per call avoids oversubscription.
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(_model_path()), sess_options=opts, providers=["CPUExecutionProvider"])
        self._sr = np.array(VAD_RATE, dtype=np.int64)
        self._lock = threading.Lock()

    def open(self, input_rate: int) -> VADStream:
        stream = VADStream(StreamResampler(input_rate, VAD_RATE), *_fresh())
        return stream

    def step(self, streams: Sequence[VADStream], audio: Sequence[Audio]) -> list[Audio]:
        """Feed each stream its new audio (at its input rate); return each one's window probabilities.

        Returns, per stream, float32[k] speech probabilities of the k whole windows completed by this
        audio (k varies by one between ticks: 200 ms is 6.25 windows). All streams' j-th windows run
        as one batch, so the cost grows with the number of window positions, not of sessions.
        """
        assert len(streams) == len(audio), "one audio chunk per stream"
        for s, a in zip(streams, audio, strict=True):
            s.pending = np.concatenate([s.pending, s.resampler.process(a)])
        counts = [len(s.pending) // WINDOW for s in streams]
        probs = [np.zeros(n, dtype=np.float32) for n in counts]
        for j in range(max(counts, default=0)):
            rows = [i for i, n in enumerate(counts) if n > j]
            x = np.stack(  # [B, CONTEXT + WINDOW]
                [np.concatenate([streams[i].context, streams[i].pending[j * WINDOW : (j + 1) * WINDOW]]) for i in rows]
            )
            state = np.stack([streams[i].state for i in rows], axis=1)  # [2, B, 128]
            with self._lock:
                out, new_state = self._session.run(None, {"input": x, "state": state, "sr": self._sr})
            for b, i in enumerate(rows):
                probs[i][j] = out[b, 0]
                streams[i].state = np.ascontiguousarray(new_state[:, b, :])
                streams[i].context = x[b, -CONTEXT:].copy()
        for s, n in zip(streams, counts, strict=True):
            s.pending = s.pending[n * WINDOW :]
            s.windows += n
        return probs


_shared: Shared[SileroVAD] = Shared(SileroVAD)


def shared_vad() -> SileroVAD:
    """One process-wide model; sessions share it through their own `VADStream`s."""
    return _shared.get()


def speech_probabilities(audio: Audio, sample_rate: int) -> Audio:
    """Speech probability of every 32 ms window of a whole clip (float32[len_16k // 512])."""
    vad = shared_vad()
    x = resample(np.asarray(audio, dtype=np.float32), sample_rate, VAD_RATE)
    stream = vad.open(VAD_RATE)
    return vad.step([stream], [x])[0]


def speech_segments(
    audio: Audio,
    sample_rate: int,
    threshold: float = 0.5,
    min_speech_s: float = 0.25,
    min_silence_s: float = 0.1,
    pad_s: float = 0.03,
) -> list[tuple[float, float]]:
    """(start s, end s) of each speech segment in a clip, Silero at 16 kHz.

    Hysteresis as in silero's own `get_speech_timestamps`: speech starts at a window >= threshold and
    ends once windows stay below threshold - 0.15 for `min_silence_s`; segments shorter than
    `min_speech_s` are dropped and the rest padded by `pad_s` on both sides (clipped to the clip).
    """
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    probs = speech_probabilities(audio, sample_rate)
    duration = len(audio) / sample_rate
    off = threshold - 0.15
    need_silence = max(1, round(min_silence_s / WINDOW_SECONDS))
    segments: list[tuple[float, float]] = []
    start: int | None = None
    quiet = 0
    for i, p in enumerate(probs):
        if start is None:
            if p >= threshold:
                start, quiet = i, 0
        elif p < off:
            quiet += 1
            if quiet >= need_silence:
                segments.append((start * WINDOW_SECONDS, (i - quiet + 1) * WINDOW_SECONDS))
                start = None
        else:
            quiet = 0
    if start is not None:
        segments.append((start * WINDOW_SECONDS, len(probs) * WINDOW_SECONDS))
    out = []
    for s, e in segments:
        if e - s >= min_speech_s:
            out.append((max(0.0, s - pad_s), min(duration, e + pad_s)))
    return out
