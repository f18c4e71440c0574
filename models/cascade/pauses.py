"""Pause cues: the evidence, gathered in a pause of the user's turn, of whether the turn has ended.

Smart Turn (prosody: P(end of turn) of the turn's last 8 s) and Whisper (the words so far, and with the
text model their P(finished)) are asked once per pause, after `eot_check_ms` of silence (or
`eot_check_early_ms` when no off-thread job is in flight), and used at their due micro-turns: Smart
Turn one later, Whisper `whisper_ticks`. What they said (`PauseCues`) is what the policy's end-of-turn
rule reads (policy.TurnPolicy.turn_ends). Without Whisper the words' verdict is the streaming
transcript's last word.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from models.cascade.hearing import HearingState
from models.cascade.options import CascadeOptions
from models.cascade.policy import PauseCues, TurnState
from models.speech.asr import Transcript
from models.speech.ears import Ears, Heard
from models.speech.smart_turn import SmartTurn
from models.turns.words import FINISHED, UNCLEAR, UNFINISHED, looks_complete, verdict
from models.turns.work import Job, StepClock, Workers
from streaming.types import Audio

# What a pause is judged on: Smart Turn reads the last 8 s, and Whisper's verdict on the pause (does the
# transcript end a sentence?) needs no more; transcribing a whole long turn at every pause cost up to
# ~2 s of a core per call and queued Whisper jobs far past their budget in the cascade soak.
_PAUSE_AUDIO_TICKS = 40


def _pause_audio(h: HearingState) -> Audio:
    """The end of the open turn that a pause is judged on (built only when a job is asked)."""
    recent = list(itertools.islice(h.audio, max(0, len(h.audio) - _PAUSE_AUDIO_TICKS), None))
    return np.concatenate(recent) if recent else np.zeros(0, dtype=np.float32)


@dataclass
class PauseState:
    """One session's current pause: the jobs asked about it and what they said."""

    start: float | None = None  # media time (ms) the asked pause began (None: this pause not asked yet)
    eot_job: Job[float] | None = None  # Smart Turn asked in this pause, not yet due
    text_job: Job[Heard] | None = None  # Whisper (and the text model) on the turn so far, asked in this pause
    cues: PauseCues = field(default_factory=PauseCues)  # what those said, once due
    text: Transcript | None = None  # Whisper's transcript of the turn up to this pause
    whole: bool = True  # `text` covers the whole turn (not only its last `_PAUSE_AUDIO_TICKS`)

    def forget(self) -> None:
        """Forget the cues of this pause; jobs not started yet leave their worker's queue."""
        for job in (self.eot_job, self.text_job):
            if job is not None:
                job.future.cancel()
        self.eot_job, self.text_job, self.cues, self.text, self.whole = None, None, PauseCues(), None, True
        self.start = None


class PauseJudge:
    """Asks and collects the pause cues of every session (the model's; the state is the session's).
    The options come with each call: the model's, which a driver may change between steps."""

    def __init__(self, smart_turn: SmartTurn | None, ears: Ears | None, workers: Workers, clock: StepClock) -> None:
        self.smart_turn, self.ears, self.workers, self.clock = smart_turn, ears, workers, clock

    def cues(self, o: CascadeOptions, p: PauseState, t: TurnState, tick: int, h: HearingState) -> PauseCues:
        """The cues of the current pause at micro-turn `tick`: asked once the pause is long enough,
        filled in as their jobs come due.

        Whisper decodes in a window sized to the pause's audio (at most 8 s), ~0.15 s of a core a call
        (models.speech.whisper_window), so it can hear every pause; its transcript is then also the
        final one when the pause ends the turn, and the question goes to the background reasoner at once.
        """
        if self.smart_turn is None or not t.turn or t.overlap:
            return p.cues
        # A pause is known by when it began: talking (again) since the ask makes another one, asked
        # afresh (Smart Turn's answer too: without Whisper it is all a pause leaves behind).
        pause_start = t.now_ms - t.silence_ms
        if p.start is not None and abs(pause_start - p.start) > 1.0:
            p.forget()
        if p.start is None:
            # The sooner ask puts a micro-turn more of jobs on the workers (gaps between words reach it
            # too): only when they have nothing else to do, so that a loaded machine keeps its sessions.
            early = o.eot_check_early_ms > 0 and self.workers.idle()
            if t.silence_ms < (o.eot_check_early_ms if early else o.eot_check_ms):
                return p.cues
            p.start = pause_start
            audio = _pause_audio(h)
            p.eot_job = self.workers.submit("eot", tick + 1, self.smart_turn.probability, audio)
            if self.ears is not None:
                p.text_job = self.workers.submit("asr", tick + o.whisper_ticks, self.ears.hear, audio, True)
                p.whole = len(h.audio) <= _PAUSE_AUDIO_TICKS
            return p.cues
        if p.eot_job is not None:
            with self.clock.timed("smart turn", wait=True):
                due, p_end = p.eot_job.take(tick, self.clock.left())
            if due:
                p.eot_job = None
                p.cues.p_end = 0.0 if p_end is None else p_end  # failed or late: no vote for "finished"
        if self.ears is None:
            # No better transcript: the streaming one's last word; finished after the fixed rule's silence.
            complete = looks_complete(h.partial)
            p.cues.words = UNFINISHED if not complete else FINISHED if t.silence_ms >= o.eot_silence_ms else UNCLEAR
        elif p.text_job is not None:
            with self.clock.timed("whisper", wait=True):
                due, heard = p.text_job.take(tick, self.clock.left())
            if due:
                p.text_job = None
                if heard is None:  # Whisper late (overloaded machine): the streaming transcript
                    raw = h.partial + "." if looks_complete(h.partial) else ""
                    heard = Heard(Transcript(h.partial, raw=raw))
                p.text = heard.transcript
                p.cues.words = verdict(heard.transcript.raw, heard.p_text, o.text_open, o.text_done)
                p.cues.p_text = heard.p_text
        return p.cues
