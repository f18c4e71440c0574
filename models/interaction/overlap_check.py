"""Is the user's speech over the model's a backchannel? The words' evidence, asked while it is said.

The shipped `native:tiny` stops for a listener's "mm-hm" as it stops for "wait, stop": under 8 of the 20
v1.5 backchannels of two sets that came while it spoke, it yielded one or two micro-turns into "Right.",
"Okay.", "Got it." at p(yield) 0.54-0.72, the point and the probabilities at which it yields to
interruptions (0.55-0.75, one to three micro-turns in). Their first few hundred ms sound alike; what
differs is what is said, and the backchannels of English are a small closed set.

So when the model's voice head says the user started speaking while the model speaks, an *overlap*
opens, and two cues the cascade already uses (models/cascade/overlaps.py) are gathered for it:

- the overlap probe (models.speech.overlap: a logistic probe on Whisper's encoder over the overlap's
  first ~100 ms, trained by train/overlap.py), once, inline: ~10-40 ms of a core, once per overlap;
- Whisper tiny.en's words of the overlap so far (Silero-trimmed), asked every micro-turn the user goes
  on speaking, on a worker thread, used the micro-turn after (`DUE_TICKS`; the step waits for them as
  for the turn check, turn_check.WAIT_S, and a media-pace engine and a replay through `pending_work`).

While the model speaks and the overlap is young, a stop the model decides (a yield; with the flow head
any action but speak, which gates its voice to silence; with the talker, silent or a backchannel let the
phrase under way play out) is *held*, and it goes on speaking, when the cues say backchannel (`ruling`):
its latest words are only backchannel words and phrases (`models.turns.words.only_backchannel`:
"okay", "mm-hm, I see", "oh, really?"), or, before any words are in, the probe gives P(interruption) <
`EARLY_P`. Words that say anything else ("hang on", "okay, stop"), or the user still talking when the
hold ends (`LONGEST_TICKS`; twice that while the words are only backchannels), give the held stop back
at once; with no stop held, the model decides as without the check. A hold lasts `GRACE_TICKS` after
the user falls silent: the model's own urge to yield peaks a micro-turn after the sound it answers.
The model never starts speaking because of it, and a stop the client asks for (`response.cancel`) is
never held. Talk `BYSTANDER_DB` quieter than the user's own voice (a television, someone across the room:
the overlap's level so far against the user's, re-read every micro-turn, `Overlap.hear`) holds a stop for
as long as it lasts, as it never stops the cascade. One stop it brings sooner: where the probe is sure
the overlap is an interruption (`STOP_P`) and its level is the user's (no more than `SURE_DB` under theirs;
a level between that and a bystander's waits until it is read from `BYSTANDER_TICKS` micro-turns), the
model stops the micro-turn the overlap opens rather than the 0-8 after it (2.5 on average) that the model
alone takes.

What it costs an interruption: one that opens like a backchannel ("Okay, stop ...") or that the probe
misses waits for the words that tell (a micro-turn or two). Measured: README, *Backchannels*.
`--native-overlap-check off` serves the model alone.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from models.interaction.query import shared_whisper, speech_clip, wants_whisper
from models.speech.asr import ASR_RATE, WhisperTranscriber
from models.speech.overlap import OverlapProbe, OverlapProbeError
from models.speech.vad import speech_segments
from models.turns.level import BYSTANDER_DB, LEVEL_TICKS, SpeechLevel
from models.turns.words import only_backchannel
from models.turns.work import Job
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SECONDS, Audio

log = logging.getLogger(__name__)

__all__ = ["BYSTANDER_DB", "BYSTANDER_TICKS", "DUE_TICKS", "EARLY_P", "FREE", "GRACE_TICKS", "HOLD", "LONGEST_TICKS",
           "STOP", "STOP_P", "SURE_DB", "Overlap", "OverlapChecker", "ruling"]

DUE_TICKS = 1  # Whisper's words of the overlap so far, used the micro-turn after they are asked
# The cascade's `barge_in_early_p`: at 100 ms it caught 0.85 of held-out interruptions and flagged 0.19 of
# backchannels (train/overlap.py, voices held out); here it only decides before the words are in.
EARLY_P = 0.5
# And where it is sure, the stop comes at once rather than when the model gets to it (it yields 0-8
# micro-turns after the onset it heard: 2.5 on average, 26 interruptions of two FD-bench sets, alone). A stop
# cannot be taken back as the cascade's pause is, so the bar is higher: `python -m train.overlap --threshold
# 0.9` (voices held out) caught 0.64 of interruptions and stopped 0.035 of backchannels (texts held out: 0.41,
# 0.20: a backchannel word it never heard may sound like an interruption).
STOP_P = 0.9
# ... but not for a bystander: television speech mixed well under the user sounds like an interruption to the
# probe too (on the v1.5 background lines of seed 6363 it stopped 4 of 12 sooner than the model alone), so an
# overlap `BYSTANDER_DB` quieter than the user's own voice (`UserAudio.level`) is left to the model
# (models/turns/level.py, the cascade's `background_db` too: the user's own overlaps sit -4.1 to +1.3 dB from
# their level, television 3.3-10.2 dB under it).
# ... and the first words of one read louder than it is, so the sure stop waits where the overlap's level so far
# is between the two: over its first micro-turn, television lines mixed ~10.5 dB under the user read 1.7-15.5 dB
# under the user's question (50 v1.5 background lines, seeds 4444, 5151, 9595: 7 within 5 dB, so not yet a
# bystander's; 1 within 2.5 dB), the user's own interruptions 0.1-6.1 dB over, backchannels 2.9 under to 4.4
# over (50 each; `generate`'s, measured from the overlap's start as the metadata gives it). The probe was sure
# of 2 of set 9595's 10 in real time, and stopped the model under them. So the sure stop comes at once only
# where the level reads no more than this much under the user's; between that and `BYSTANDER_DB`
# it comes once the level is read from `BYSTANDER_TICKS` micro-turns and is not a bystander's (every one of
# the 50 television lines was by then, 5.9-12.5 dB under). A user whose interruption starts this much softer
# than their turns gets the sure stop up to two micro-turns later, or the model's own.
SURE_DB = 2.5
# A stop is held for a bystander once its level is read from this many stretches of speech (micro-turns), one
# more than the cascade's `LEVEL_TICKS`: the cascade counts only micro-turns its VAD finds mostly speech, and
# without that a user's soft restart reads as one ("Hang on, is that really true?": "is that" 5.3 dB under
# their level for two micro-turns, then 3 dB over; at two it held that interruption's stop a micro-turn).
# Television mixed 10.5 dB under the user reads 4.9-11.3 dB under at three (models/cascade/options.py).
BYSTANDER_TICKS = LEVEL_TICKS + 1
# An overlap longer than 1 s is not a listener's "mm-hm" (the cascade's `barge_in_max_ms`); twice that
# while its words are only backchannels ("Mm-hmm, I see." runs 1.1-1.4 s in the espeak voices).
LONGEST_TICKS = round(1.0 / TICK_SECONDS)
GRACE_TICKS = 2
LEAD_TICKS = 1  # audio kept from before the voice head's onset: it flags speech up to a micro-turn late
PROBE_TICKS = 4  # the audio searched for the overlap's onset (Silero) for the probe: 0.8 s
# Silero's shortest speech: a backchannel heard a micro-turn in is 0.1-0.3 s of it, and the default 0.25 s
# (for whole utterances) found none in "Right." or "Got it." at the micro-turn the voice head flagged them.
MIN_SPEECH_S = 0.06
# Whisper on the first 0.1-0.2 s of a word makes up another ("Run." for the start of "Right.", "Go!" for "Got
# it", "And" for "Mm-hmm", measured on the shipped model's overlaps): words count once they come from this
# much speech ("Okay", "Wait", "Hang on." read right from 0.3 s after the onset).
WORDS_MIN_S = 0.3


@dataclass
class Overlap:
    """The user's speech over the model's, from the micro-turn the voice head heard it begin."""

    opened: int
    p_interrupt: float | None  # the probe's P(interruption); None where the probe is not at hand
    user_db: float | None = None  # the user's own speech level (None: not heard yet)
    level: SpeechLevel = field(default_factory=SpeechLevel)  # the overlap's speech level so far
    words: str = ""  # Whisper's latest non-empty words of it
    job: Job[str] | None = None  # Whisper on the overlap so far
    ended: int | None = None  # the micro-turn the user fell silent (None: still speaking)
    held_stop: bool = False  # a stop the model decided was held

    def hear(self, audio: Audio) -> None:
        """One more stretch of the overlap's audio (float32, any rate: the level is a mean power): the level so
        far says whether it is a bystander's. An utterance's first words are its loudest: television speech
        mixed 10.5 dB under the user reads 3.3-10.2 dB under at two micro-turns, 4.9-11.3 at three (the
        cascade's measure, models/cascade/options.py), so it is judged afresh as the overlap goes on."""
        self.level.add(audio, skip_silent=True)

    @property
    def under_db(self) -> float | None:
        """How much quieter than the user's own voice its speech so far is (None: either level not heard yet)."""
        db = self.level.db
        return None if db is None or self.user_db is None else self.user_db - db

    @property
    def bystander(self) -> bool:
        """Its speech so far is `BYSTANDER_DB` quieter than the user's own."""
        under = self.under_db
        return under is not None and under > BYSTANDER_DB

    @property
    def users(self) -> bool:
        """... or no more than `SURE_DB` quieter (or either level unknown): the user's, surely."""
        under = self.under_db
        return under is None or under <= SURE_DB

    def collect(self, tick: int, wait: float) -> None:
        """Take the words due by `tick` (waiting up to `wait` seconds); late or failed words change nothing."""
        job = self.job
        if job is None or not job.is_due(tick):
            return
        self.job = None
        words = (job.settle(wait) or "").strip()
        if words:
            self.words = words

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.job = None


HOLD, STOP, FREE = "hold", "stop", "free"


def ruling(ov: Overlap, tick: int) -> str:
    """What the overlap's cues say at micro-turn `tick` of a stop the model decides (module docstring):
    HOLD it (young, and the cues say backchannel; or a bystander's talk, while it lasts); STOP, where
    before any words the probe is sure it is an interruption (`STOP_P`) said at the user's level
    (`SURE_DB`, or not `BYSTANDER_DB` under it once read from `BYSTANDER_TICKS`), or a stop was held and the user
    is still at it or said something else ("Okay, stop.", "Hang on."): the stop the model wanted, or would
    want, now; FREE: the model decides."""
    read = not ov.bystander and (ov.users or ov.level.ticks >= BYSTANDER_TICKS)  # the user's, surely
    if not ov.words and read and ov.p_interrupt is not None and ov.p_interrupt >= STOP_P:
        return STOP
    if ov.bystander and ov.level.ticks >= BYSTANDER_TICKS and (ov.ended is None or tick - ov.ended <= GRACE_TICKS):
        return HOLD  # a bystander's talk (a television, someone across the room) stops nothing: the cascade's rule
    bc_words = bool(ov.words) and only_backchannel(ov.words)
    young = tick - ov.opened < LONGEST_TICKS * (2 if bc_words else 1)
    backchannel = bc_words if ov.words else ov.p_interrupt is not None and ov.p_interrupt < EARLY_P
    if young and (ov.ended is None or tick - ov.ended <= GRACE_TICKS) and backchannel:
        return HOLD
    if ov.held_stop and not ov.bystander and (ov.ended is None or (bool(ov.words) and not bc_words)):
        return STOP  # (a bystander's words are not the user's: no stop to give back when they end)
    return FREE


class OverlapChecker:
    """The probe (inline, once per overlap) and Whisper on the overlap's words (one worker thread, shared by
    a model's sessions). Both load on the worker at start-up; where they fail to, the model decides alone."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="native-overlap-check")
        self._ready: Future[tuple[WhisperTranscriber, OverlapProbe | None]] = self._pool.submit(self._load)

    @staticmethod
    def _load() -> tuple[WhisperTranscriber, OverlapProbe | None]:
        whisper = shared_whisper()
        try:
            probe = OverlapProbe(whisper)
        except OverlapProbeError as e:
            log.warning("overlap check without the probe (%s): the words alone hold a stop", e)
            return whisper, None
        # Once here what the inference thread runs at an overlap's onset: the first call costs ~0.1 s more
        # (measured: 124 ms, then 32-73 ms), which a step would otherwise pay.
        quiet = np.zeros(ASR_RATE // 2, dtype=np.float32)
        speech_segments(quiet, ASR_RATE, min_speech_s=MIN_SPEECH_S)
        probe.probability(quiet, 0)
        return whisper, probe

    @staticmethod
    def for_mode(mode: str) -> OverlapChecker | None:
        """`--native-overlap-check`: words (an error if Whisper is not installed), off (None), auto (words
        where Whisper is installed)."""
        return OverlapChecker() if wants_whisper(mode, "--native-overlap-check", "words", "off") else None

    def open(self, tick: int, recent: np.ndarray, user_db: float | None = None) -> Overlap:
        """An overlap heard beginning at `tick`; `recent`: the user's last `PROBE_TICKS` micro-turns, int16 at
        `SAMPLE_RATE` (what the probe judges from Silero's onset in it); `user_db`: the user's own speech
        level (None: not heard yet)."""
        # Waited for, not skipped while loading: a replay of the session (replay.py) must hear the same cues.
        # It loads at start-up (Whisper 0.5 s), long before a model has spoken enough to be talked over.
        ov = Overlap(opened=tick, p_interrupt=None, user_db=user_db)
        probe = None if self._ready.exception() is not None else self._ready.result()[1]
        if probe is None:
            return ov
        clip = resample(recent.astype(np.float32) / 32767.0, SAMPLE_RATE, ASR_RATE)
        spans = speech_segments(clip, ASR_RATE, min_speech_s=MIN_SPEECH_S)
        if not spans:
            return ov  # Silero hears no speech yet: no early cue; the words will tell
        onset = int(spans[-1][0] * ASR_RATE)
        ov.p_interrupt = probe.probability(clip, onset)
        for i in range(onset, len(clip), ASR_RATE // 5):  # micro-turn by micro-turn, as `hear` goes on
            ov.hear(clip[i : i + ASR_RATE // 5])
        return ov

    def ask(self, ov: Overlap, tick: int, audio: np.ndarray) -> None:
        """Whisper on the overlap so far (`audio`: int16 at `SAMPLE_RATE`, from just before its onset to
        now), due the micro-turn after `tick`."""
        ov.cancel()
        ov.job = Job(self._pool.submit(self._words, audio), tick + DUE_TICKS, "overlap words")

    def _words(self, audio: np.ndarray) -> str:
        speech = speech_clip(audio, MIN_SPEECH_S)
        if speech is None or len(speech) < WORDS_MIN_S * ASR_RATE:
            return ""  # too little to read yet: the probe decides meanwhile
        whisper, _ = self._ready.result()
        return whisper.transcribe(speech).raw

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
