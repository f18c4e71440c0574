"""The assistant's mouth: a queue of phrases turned into 24 kHz audio and cut into micro-turns.

Synthesis never runs inside `step`: `Synthesizer` owns a small thread pool (`tts_workers` threads)
shared by every session; a phrase is submitted as soon as its text is known and is *due* a fixed
number of micro-turns later (a budget from its length, `Speaker.budget_ticks`): it never plays
before that micro-turn, and at that micro-turn a real-time tick waits for it up to `_SYNTH_GRACE_S`
(the cascade passes what is left of its step's shared grace instead; later it plays when ready);
a media-pace session is stepped only once it is done (`waiting`), so a
media-pace run (ticks flat out) plays it at the same micro-turn as real time does.
Pre-rendered phrases (acknowledgments, backchannels) skip the pool, which is
what lets the first reply audio start in the very micro-turn the end of a turn is detected.

The pool serves the phrase needed soonest first (earliest deadline), not the first submitted: every
session's answer arrives as several sentences within a moment, and with several sessions asking at
once a first-come queue made one session's first sentence wait behind another's second and third,
which would only play seconds later (one synthesis thread, ~17 ms a word: six sessions' three-sentence
answers are ~5 s of synthesis). A phrase is needed when the audio queued ahead of it in its session
has played (`Speaker.say` estimates it), so a first sentence goes ahead of every later one, and a
later sentence dropped by a barge-in before its turn costs nothing.
Nor is a phrase synthesised long before it is needed: one needed more than `HORIZON_S` from now waits
(the worker sleeps) until it is that close, or until its speaker needs it now (`hurry`: its due
micro-turn came, which in media pace comes sooner than the wall clock says). Work done seconds ahead
took the cores from what was needed now (other sessions' first sentences and transcripts at the
moment several turns end at once), and was wasted when the user interrupted or left.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import numpy as np

from models.speech.tts import TTSError, Voice, load_voice
from models.turns.work import LATE
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, Audio

log = logging.getLogger(__name__)
_SYNTH_GRACE_S = 0.05  # longest wait at a phrase's due micro-turn; later it plays when ready
# Piper starts every phrase with 50-80 ms of near-silence (measured on joe: "Okay." 54 ms, "Yeah." 64 ms,
# "Hmm, let me think." 78 ms before 2% of the phrase's peak). The acknowledgment is the reply's first
# sound, so that silence is added to every turn's response latency: cut it, keeping a few ms so the
# onset is not clipped.
_LEAD_KEEP_S = 0.01
_LEAD_LEVEL = 0.02  # of the phrase's peak: below it is silence
# Seconds of speech a character of text becomes, to estimate when a queued phrase will be needed:
# an under-estimate (Piper joe speaks ~14 characters a second) only makes later phrases look more
# urgent than they are, never less.
_SPOKEN_S_PER_CHAR = 0.05
HORIZON_S = 2.0  # a phrase is synthesised from this long before it is needed (several times its cost)


def trim_lead(audio: Audio, rate: int = SAMPLE_RATE) -> Audio:
    """`audio` without its leading silence but `_LEAD_KEEP_S` of it (all-silent audio is kept as is)."""
    if not len(audio):
        return audio
    loud = np.flatnonzero(np.abs(audio) > _LEAD_LEVEL * float(np.abs(audio).max()))
    if not len(loud):
        return audio
    return audio[max(0, int(loud[0]) - int(_LEAD_KEEP_S * rate)) :]


class Synthesizer:
    """Text -> 24 kHz audio on worker threads, the phrase needed soonest first; also a cache of
    pre-rendered short phrases."""

    def __init__(self, voice: str, fallback: str, workers: int = 1) -> None:
        self.voice = _load(voice, fallback)
        self._cache: dict[str, Audio] = {}
        self._lock = threading.Lock()
        self._jobs: list[tuple[float, int, str, Future[Audio]]] = []  # a heap by (needed at, order)
        self._taken: set[int] = set()  # orders of jobs whose entry was replaced by `hurry`'s
        self._order = itertools.count()
        self.horizon = HORIZON_S
        self._ready = threading.Condition()
        self._closed = False
        # Started here, not on first use: a server's thread count is fixed at load (models/threads.py).
        self._threads = [threading.Thread(target=self._serve, name=f"cascade-tts_{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def render(self, text: str) -> Audio:
        """Synthesise now, on the calling thread (used for the phrase cache at load time)."""
        parts = list(self.voice.sentences(text))
        audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        return trim_lead(resample(audio, self.voice.sample_rate, SAMPLE_RATE))

    def prerender(self, phrases: tuple[str, ...]) -> None:
        for p in phrases:
            self._cache[p] = self.render(p)

    def cached(self, text: str) -> Audio | None:
        return self._cache.get(text)

    def submit(self, text: str, needed_at: float | None = None) -> Future[Audio]:
        """Synthesise `text` on a worker; `needed_at` (time.monotonic() s, default now) orders the work."""
        future: Future[Audio] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the synthesizer is closed")
            when = time.monotonic() if needed_at is None else needed_at
            heapq.heappush(self._jobs, (when, next(self._order), text, future))
            self._ready.notify()
        return future

    def hurry(self, future: Future[Audio]) -> None:
        """The phrase of `future` is needed now: it goes to the head of the queue (if still waiting)."""
        if future.done():
            return
        with self._ready:
            for when, order, text, f in self._jobs:
                if f is future and order not in self._taken:  # its one live entry
                    now = time.monotonic()
                    if when > now:
                        self._taken.add(order)  # its old entry is skipped when popped
                        heapq.heappush(self._jobs, (now, next(self._order), text, f))
                        self._ready.notify()
                    return

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._closed:
                    while self._jobs and self._jobs[0][1] in self._taken:
                        self._taken.discard(heapq.heappop(self._jobs)[1])
                    wait = None if not self._jobs else self._jobs[0][0] - self.horizon - time.monotonic()
                    if wait is not None and wait <= 0:
                        break
                    self._ready.wait(wait)  # a new job, a hurry, or the head coming within the horizon
                if self._closed:
                    return
                _, _, text, future = heapq.heappop(self._jobs)
            if future.done() or future.running() or not future.set_running_or_notify_cancel():
                continue  # dropped by its speaker before its turn
            try:
                future.set_result(self.render(text))
            except BaseException as e:  # handed to whoever plays it (Speaker.play skips the phrase)
                future.set_exception(e)

    def close(self) -> None:
        with self._ready:
            self._closed = True
            for _, _, _, future in self._jobs:
                future.cancel()
            self._jobs.clear()
            self._taken.clear()
            self._ready.notify_all()


def _load(voice: str, fallback: str) -> Voice:
    try:
        return load_voice(voice)
    except TTSError as e:
        if not fallback or fallback == voice:
            raise
        log.warning("voice %s unavailable (%s); falling back to %s", voice, e, fallback)
        return load_voice(fallback)


@dataclass
class Phrase:
    """One queued piece of speech."""

    text: str
    kind: str  # "ack", "answer", "backchannel", "say", "error"
    future: Future[Audio] | None = None  # pending synthesis; None once `audio` is known
    audio: Audio | None = None  # 24 kHz, set when rendered
    pos: int = 0  # samples of `audio` already played
    request_id: str = ""  # the background request it came from (answers only)
    due: int = 0  # the speaker's micro-turn from which it may play (its synthesis budget)


@dataclass
class TickSpeech:
    audio: Audio  # float32[TICK_SAMPLES]
    text: str  # text of phrases that started playing this tick
    started: list[Phrase] = field(default_factory=list)
    finished: list[Phrase] = field(default_factory=list)
    starved: bool = False  # a phrase was queued but its audio was not ready (synthesis lagging)


class Speaker:
    """Per-session output queue. `play()` yields exactly one micro-turn of audio."""

    def __init__(self, synth: Synthesizer, base_ms: float = 100.0, ms_per_char: float = 12.0) -> None:
        self._synth = synth
        self.queue: deque[Phrase] = deque()
        self.starved_ticks = 0  # micro-turns where queued speech was not synthesised in time
        self.tick = 0  # index of the next micro-turn to play (the clock of `Phrase.due`)
        self.base_ms, self.ms_per_char = base_ms, ms_per_char

    def budget_ticks(self, text: str) -> int:
        """Micro-turns a phrase's synthesis is given (measured: Piper ~10 ms per character on 2
        shared cores, plus start-up)."""
        return max(1, math.ceil((self.base_ms + self.ms_per_char * len(text)) / (TICK_SAMPLES / SAMPLE_RATE * 1000)))

    def say(self, text: str, kind: str, request_id: str = "") -> Phrase:
        cached = self._synth.cached(text)
        p = Phrase(text, kind, request_id=request_id)
        if cached is not None:
            p.audio = cached
        else:
            p.future = self._synth.submit(text, time.monotonic() + self.seconds_queued(kind))
            p.due = self.tick + self.budget_ticks(text)
        if kind == "backchannel" and not (self.queue and self.queue[0].pos > 0):
            # A backchannel is said now, in a pause of the user, ahead of any answer held back
            # while the user talks (never mid-phrase: then the queue head is already playing).
            self.queue.appendleft(p)
        else:
            self.queue.append(p)
        return p

    def seconds_queued(self, kind: str) -> float:
        """Seconds of speech that play before a new phrase of `kind` starts: what is queued ahead of it
        (a backchannel goes to the front, so nothing), rendered phrases by their audio, pending ones
        estimated from their text."""
        if kind == "backchannel":
            return 0.0
        total = 0.0
        for p in self.queue:
            if p.audio is not None:
                total += (len(p.audio) - p.pos) / SAMPLE_RATE
            else:
                total += _SPOKEN_S_PER_CHAR * len(p.text)
        return total

    def waiting(self) -> list[Future[Audio]]:
        """The next phrase's synthesis, when the next micro-turn may play it (its budget is up)."""
        p = self.queue[0] if self.queue else None
        if p is None or p.future is None or self.tick < p.due:
            return []
        self._synth.hurry(p.future)  # media pace reaches a due micro-turn before the wall clock does
        return [p.future]

    @property
    def busy(self) -> bool:
        """Anything queued or playing, backchannels excluded (they never hold the floor)."""
        return any(p.kind != "backchannel" for p in self.queue)

    @property
    def playing_backchannel(self) -> bool:
        return bool(self.queue) and self.queue[0].kind == "backchannel"

    def drop(self, kinds: tuple[str, ...] | None = None) -> list[Phrase]:
        """Stop now: forget queued phrases (all, or those of `kinds`); returns what was dropped."""
        keep = deque(p for p in self.queue if kinds is not None and p.kind not in kinds)
        dropped = [p for p in self.queue if p not in keep]
        for p in dropped:
            if p.future is not None:
                p.future.cancel()  # a running synthesis finishes and is ignored
        self.queue = keep
        return dropped

    def play(self, hold: bool = False, grace: float = _SYNTH_GRACE_S) -> TickSpeech:
        """One micro-turn of audio. `hold`: the user has the floor; play backchannels only. `grace`: how
        long to wait for a phrase due now whose synthesis is late (the step's remaining grace)."""
        out = np.zeros(TICK_SAMPLES, dtype=np.float32)
        filled = 0
        res = TickSpeech(out, "")
        texts = []
        while filled < TICK_SAMPLES and self.queue:
            p = self.queue[0]
            if hold and p.kind != "backchannel":
                break
            if p.audio is None:
                assert p.future is not None
                if self.tick < p.due:
                    res.starved = True  # within its budget: not yet, even if it happens to be ready
                    break
                self._synth.hurry(p.future)  # needed now: if it still waits, it goes next
                try:
                    p.audio = p.future.result(timeout=grace if self.tick == p.due else 0.0)
                except FutureTimeout:
                    res.starved = True  # over budget (an overloaded machine): plays when ready
                    if self.tick == p.due:
                        LATE.note("speech synthesis")
                    break
                except Exception as e:  # a phrase that cannot be spoken is skipped, not fatal
                    log.warning("synthesis of %r failed: %s", p.text, e)
                    p.audio = np.zeros(0, dtype=np.float32)
                p.future = None
            if p.pos == 0:
                res.started.append(p)
                texts.append(p.text)
            take = min(TICK_SAMPLES - filled, len(p.audio) - p.pos)
            out[filled : filled + take] = p.audio[p.pos : p.pos + take]
            filled += take
            p.pos += take
            if p.pos >= len(p.audio):
                res.finished.append(self.queue.popleft())
        if res.starved:
            self.starved_ticks += 1
        self.tick += 1
        res.text = "".join(t + " " for t in texts)  # deltas concatenate into the transcript
        return res
