"""Overlap cues: what is known about the user's speech over the assistant's, for the policy to tell an
interruption from a backchannel, from a bystander and from our own echo.

Two cues are gathered here (the level that tells a bystander apart is level.py's; the echo of our
own words, answers.py's): the overlap probe's P(interruption), from the first `barge_in_early_ms` of
the overlap's speech (models.speech.overlap), and Whisper's words of the overlap so far, asked every
micro-turn the overlap's speech has grown and used the micro-turn after. The policy's rules 2-2d
(policy.py) decide with them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from models.cascade.hearing import HearingState
from models.cascade.options import CascadeOptions
from models.cascade.policy import TurnState
from models.speech.ears import Ears, Heard
from models.speech.overlap import OverlapProbe, onset_index
from models.turns.work import Job, StepClock, Workers

log = logging.getLogger(__name__)


def _rounded(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


@dataclass
class OverlapState:
    """One session's open overlap (kept, but not used, once its turn is no longer an overlap)."""

    p_interrupt: float | None = None  # the overlap probe's P(interruption) of the open overlap, once asked
    job: Job[Heard] | None = None  # Whisper on the open overlap so far, not yet due
    heard_ms: float = 0.0  # the overlap's speech (TurnState.turn_speech_ms) when that job was asked
    words: str | None = None  # the latest non-empty transcript of the open overlap

    def forget_words(self) -> None:
        if self.job is not None:
            self.job.future.cancel()
        self.job, self.heard_ms, self.words = None, 0.0, None

    def reset(self) -> None:
        """A new user turn: nothing is known of it yet."""
        self.p_interrupt = None
        self.forget_words()


class OverlapJudge:
    """Asks and collects the overlap cues of every session (the model's; the state is the session's).
    The options come with each call: the model's, which a driver may change between steps."""

    def __init__(self, probe: OverlapProbe | None, ears: Ears | None, workers: Workers, clock: StepClock) -> None:
        self.probe, self.ears, self.workers, self.clock = probe, ears, workers, clock

    def probe_once(self, o: CascadeOptions, v: OverlapState, t: TurnState, h: HearingState) -> None:
        """Ask the overlap probe once per overlap, in the first micro-turn with `barge_in_early_ms` of its
        speech. Inline on the tick thread (~4 ms of Whisper's encoder, which releases the GIL): its
        answer is needed in this micro-turn, and overlaps are rare. A failure only loses the early cue."""
        if self.probe is None or not (t.turn and t.overlap) or v.p_interrupt is not None:
            return
        if t.turn_speech_ms < o.barge_in_early_ms:
            return
        audio = h.turn_audio()
        with self.clock.timed("overlap probe"):
            try:
                v.p_interrupt = self.probe.probability(audio, onset_index(len(audio), h.samples, t.turn_started_ms))
            except Exception as e:  # never let a classifier stop a session
                log.warning("overlap probe failed (%s: %s); judging this overlap by its length", type(e).__name__, e)
                v.p_interrupt = 0.0

    def hear(self, o: CascadeOptions, v: OverlapState, t: TurnState, tick: int, h: HearingState,
             sounds_like_user: bool) -> None:
        """Whisper on the open overlap, asked every micro-turn whose speech has grown since the last ask
        (from `barge_in_early_ms` of it on) and used the micro-turn after, like every Whisper job.
        Its latest words (`v.words`) feed the policy's rule 2c. Overlaps are short and rare, so a few
        ~0.1 s transcriptions each; an overlap that already sounds like a bystander's talk is not
        transcribed (it pauses nothing anyway)."""
        if self.ears is None or not o.overlap_words:
            return
        if not (t.turn and t.overlap):
            v.forget_words()
            return
        if v.job is not None:
            with self.clock.timed("whisper", wait=True):
                due, heard = v.job.take(tick, self.clock.left())
            if due:
                v.job = None
                if heard is not None and heard.transcript.text:
                    v.words = heard.transcript.text
        grown = t.turn_speech_ms >= o.barge_in_early_ms and t.turn_speech_ms > v.heard_ms
        if v.job is None and grown and sounds_like_user:
            v.heard_ms = t.turn_speech_ms
            v.job = self.workers.submit("asr", tick + 1, self.ears.hear, h.turn_audio(), False)


def log_overlap(v: OverlapState, t: TurnState, h: HearingState, user_db: float | None, bystander: bool | None) -> None:
    """What the policy is given about an open overlap, at debug level (why it paused, went on or stopped)."""
    if t.overlap and log.isEnabledFor(logging.DEBUG):
        log.debug(
            "overlap at %.0f ms: %.0f ms speech, level %s dB over %d ticks (user %s), bystander %s, "
            "P(interruption) %s, words %r",
            t.now_ms, t.turn_speech_ms, _rounded(h.level.db, 1), h.level.ticks, _rounded(user_db, 1), bystander,
            _rounded(v.p_interrupt, 2), v.words,
        )
