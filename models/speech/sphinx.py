"""pocketsphinx (ships an English model): pooled decoders and the streaming recogniser.

pocketsphinx decoders are expensive to build (~1 s: acoustic model, dictionary, language model) and
hold a few tens of MB, so they are pooled: a session's `SphinxRecognizer` borrows one only for the
duration of an utterance (VAD-gated) and returns it afterwards. Audio is 16 kHz float32.

This module imports nothing heavier than numpy and pocketsphinx, because the ASR worker process
(`sphinx_worker`) runs it: pocketsphinx holds the GIL while it decodes, so the cascade decodes in
other processes (`sphinx_remote`) to keep its tick thread free.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from streaming.types import Audio

ASR_RATE = 16_000
_FEED_BYTES = ASR_RATE // 50 * 2  # 20 ms of PCM16 per process_raw call (see SphinxRecognizer.feed_pcm)
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
# Where Whisper makes the final transcript, the streaming one only feeds the turn-taking cues (content
# words in an overlap, an unfinished clause), so it can be cheaper still: a narrower beam and the
# top 2 Gaussians: about half the CPU for a few points of word error (`python -m bench.asr_wer`
# compares the two; figures in the README's voice section).
PARTIALS_CONFIG: dict[str, Any] = {**STREAMING_CONFIG, "maxhmmpf": 1500, "beam": 1e-40, "topn": 2}

# Search settings by name: what a pool, a worker process (`--config`) and the cascade agree on.
CONFIGS: dict[str, dict[str, Any]] = {"offline": {}, "streaming": STREAMING_CONFIG, "partials": PARTIALS_CONFIG}
_pools: dict[str, DecoderPool] = {}
_pools_lock = threading.Lock()


def shared_pool(config: str = "streaming", size: int = 1) -> DecoderPool:
    """The process-wide pool of decoders with the named search settings (`CONFIGS`), grown to `size`."""
    if config not in CONFIGS:
        raise ValueError(f"unknown pocketsphinx config {config!r}; one of {sorted(CONFIGS)}")
    with _pools_lock:
        if config not in _pools:
            _pools[config] = DecoderPool(0, **CONFIGS[config])
        pool = _pools[config]
        while pool.built < size:
            pool.release(pool._build())
        return pool


class Recognizer(Protocol):
    """A per-session streaming recogniser; one utterance at a time.

    `feed` = `send` then `collect`. The split lets a caller send every session's audio first and
    collect the partials afterwards, so recognisers in other processes decode while it does other
    work; `send(..., reply=False)` asks for no partial (pre-roll audio nobody reads the partial of).
    """

    active: bool

    def start(self) -> None: ...
    def feed(self, audio: Audio) -> str: ...
    def send(self, audio: Audio, reply: bool = True) -> None: ...
    def collect(self, timeout: float = 1.0) -> str: ...
    def waiting(self) -> list[Future[bytes]]: ...
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
        self.send(audio)
        return self.partial

    def send(self, audio: Audio, reply: bool = True) -> None:
        """Decode `audio` now (in this process); `collect` returns the partial."""
        if not self.active:
            raise ASRError("feed() before start(); start an utterance first")
        if len(audio):
            self.feed_pcm(_to_pcm16(audio), reply)

    def feed_pcm(self, pcm: bytes, reply: bool = True) -> None:
        """Decode 16 kHz PCM16 bytes (what the ASR worker process receives)."""
        # pocketsphinx holds the GIL for a whole process_raw call (measured: a 200 ms chunk blocked
        # the event loop for tens of ms, which stalled WebRTC pacing). Feeding 20 ms pieces gives
        # the GIL back between them, so the event loop waits for one piece at most.
        for i in range(0, len(pcm), _FEED_BYTES):
            self._decoder.process_raw(pcm[i : i + _FEED_BYTES], False, False)
        if reply:
            hyp = self._decoder.hyp()
            self.partial = " ".join(w for w in (_clean(x) for x in (hyp.hypstr.split() if hyp else [])) if w)

    def collect(self, timeout: float = 1.0) -> str:
        return self.partial

    def waiting(self) -> list[Future[bytes]]:
        return []  # decoded in `send`: nothing outstanding

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
