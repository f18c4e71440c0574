"""Smart Turn v3.2: a learned "has the speaker finished?" classifier on the audio of a turn.

The model (a Whisper-tiny encoder with a small head, 8.7 MB ONNX, BSD-2) is shipped inside the
`pipecat-ai` wheel. We only need that file: the wheel is installed without its dependencies (see the
Makefile) and located with `importlib.util.find_spec`, so pipecat itself is never imported. Features
are Whisper's log-mel spectrogram computed here in numpy (no `transformers`, no torch).

Input: the last 8 s of the user's turn at 16 kHz (shorter turns are left-padded with zeros).
Output: P(turn complete) in [0, 1].
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import numpy.typing as npt

from models.speech.shared import Shared
from streaming.types import Audio

RATE = 16_000
SECONDS = 8  # the model's fixed window
_N_FFT = 400  # 25 ms Hann window
_HOP = 160  # 10 ms hop -> 800 frames in 8 s
_N_MELS = 80
_MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
_PACKAGE = "pipecat"
_REL_PATH = ("audio", "turn", "smart_turn", "data", _MODEL_FILE)


class SmartTurnError(RuntimeError):
    """The Smart Turn weights could not be found or loaded."""


def model_path() -> Path:
    """Where the installed pipecat-ai wheel keeps the ONNX file (pipecat is not imported)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SmartTurnError(
            "the Smart Turn model ships in the `pipecat-ai` wheel, which is not installed; "
            "`pip install --no-deps pipecat-ai` (only its data file is used), or set smart_turn=false"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*_REL_PATH)
    if not path.exists():
        raise SmartTurnError(f"pipecat-ai is installed but {path} is missing; install pipecat-ai>=1.0")
    return path


def _hz_to_mel(f: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # Slaney scale: linear below 1 kHz (3 mel per 200 Hz), logarithmic above.
    f = np.asarray(f, dtype=np.float64)
    lin = f * 3.0 / 200.0
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-9) / 1000.0) * 27.0 / np.log(6.4), lin)


def _mel_to_hz(m: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((m - 15.0) * np.log(6.4) / 27.0), m * 200.0 / 3.0)


@functools.cache
def _mel_filters() -> npt.NDArray[np.float64]:
    """[80, 201] Slaney-normalised triangular filters over 0..8 kHz (Whisper's filterbank)."""
    bins = np.linspace(0.0, RATE / 2, _N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(RATE / 2)), _N_MELS + 2))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lo) / (mid - lo)
    falling = (hi - bins[None, :]) / (hi - mid)
    tri = np.maximum(0.0, np.minimum(rising, falling))
    return tri * (2.0 / (hi - lo))  # equal area per filter


@functools.cache
def _window() -> npt.NDArray[np.float64]:
    n = np.arange(_N_FFT)
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / _N_FFT)  # periodic Hann


def log_mel(audio: Audio) -> Audio:
    """16 kHz clip -> Whisper log-mel features [80, 800] of its last 8 s (zero-padded in front).

    Whisper's recipe: the waveform is normalised to zero mean and unit variance, a centred STFT
    (reflect padding) gives 801 frames of which the last is dropped, log10 of the mel power is
    floored 8 decades below its maximum and mapped by (x + 4) / 4.
    """
    n = RATE * SECONDS
    x = np.asarray(audio, dtype=np.float32).reshape(-1)[-n:]
    if len(x) < n:
        x = np.concatenate([np.zeros(n - len(x), dtype=np.float32), x])
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x.astype(np.float64), _N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, _N_FFT)[::_HOP]  # [801, 400]
    power = np.abs(np.fft.rfft(frames * _window(), axis=-1)) ** 2  # [801, 201]
    mel = _mel_filters() @ power[:-1].T  # [80, 800]
    logspec = np.log10(np.maximum(mel, 1e-10))
    logspec = np.maximum(logspec, logspec.max() - 8.0)
    return ((logspec + 4.0) / 4.0).astype(np.float32)


class SmartTurn:
    """The shared classifier. Thread-safe; onnxruntime releases the GIL while it runs."""

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # Called from one worker thread next to the tick thread on few cores: never oversubscribe.
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                str(path or model_path()), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime raises its own exception types for bad files
            raise SmartTurnError(f"could not load the Smart Turn model: {e}") from e
        self._input = self._session.get_inputs()[0].name

    def probability(self, audio: Audio) -> float:
        """P(the speaker has finished) for a 16 kHz clip ending now (its last 8 s are used)."""
        feats = log_mel(audio)[None]  # [1, 80, 800]
        # InferenceSession.run is thread-safe: the cascade's eot workers run calls side by side.
        out = self._session.run(None, {self._input: feats})[0]
        return float(np.asarray(out).reshape(-1)[0])


_shared: Shared[SmartTurn] = Shared(SmartTurn)


def shared_smart_turn() -> SmartTurn:
    """The process-wide classifier (loaded once, ~0.2 s)."""
    return _shared.get()
