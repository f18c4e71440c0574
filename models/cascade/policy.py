"""The full-duplex turn-taking policy: pure decisions from what the streams contained this micro-turn.

No audio, no models: the cascade feeds it Silero probabilities (of the echo-cancelled input), the
recogniser's partial transcript and whether the assistant holds the floor, and it answers with what to
do now. There is no blocking "turn" mode: every micro-turn re-decides, so overlap, pauses and
interruptions are just states of the counters below.

Rules (all thresholds are `CascadeOptions` fields):
  1. user speech opens a turn after `min_speech_ms` of speech; if the assistant is speaking the turn
     is an *overlap* until it proves to be a barge-in;
  2. an overlap with `barge_in_pause_ms` of speech pauses the assistant (`TurnState.paused`); it
     becomes a barge-in `barge_in_ms` after its onset if it holds `barge_in_words` words
     that are neither backchannels ("yeah", "okay") nor echo of the assistant, and after
     `barge_in_max_ms` after it whatever the words; an overlap that falls silent for
     `OVERLAP_END_MS` before that was a backchannel (or echo) unless rule 2d says otherwise:
     dropped, the assistant goes on from where it paused;
  2a. it pauses the assistant sooner, at `barge_in_early_ms` of speech, when the overlap probe (what
     the first few hundred ms say: "wait", "sorry, but" rather than "mm-hm", "yeah") gives
     P(interruption) >= `barge_in_early_p`, unless the words already say backchannel (2c);
  2b. an overlap judged to be bystander speech (much quieter than the user's own voice, decided
     by the cascade from levels, level.py) never pauses nor stops the assistant; it just ends when it falls
     silent; such a turn opened while the assistant was quiet gets no backchannel either;
  2c. Whisper transcribes the overlap every micro-turn; while its latest words are all backchannels
     ("yeah, yeah", "mm-hm, I see") the overlap may last twice `barge_in_max_ms` before it is a
     barge-in, and while they are clearly one (at least one word or phrase that does not also open a
     turn: "mm-hm", "oh, really?", "I see", not "okay" or "yeah" alone, which open "okay, stop") the
     pause waits too, and one already taken (by length on a misheard half word, or by the probe) ends;
     when they are backchannels that may open a turn ("okay", "yeah"), a pause ends once the user
     has been silent `RESUME_MS` (speech again pauses again: "okay... stop");
  2d. an overlap that falls silent is a barge-in, not a backchannel, when the probe heard an
     interruption and Whisper's words of it are neither backchannels nor our echo ("Stop.", "Hold
     on."): a short interruption is said and then waits for the assistant to stop;
  3. with Smart Turn, a turn ends when the words of the turn so far (Whisper's transcript) end a
     sentence and Smart Turn agrees, or a little later when Smart Turn does not, else after the
     eagerness' maximum silence (`TurnPolicy.turn_ends`). Without Smart Turn: after
     `eot_silence_ms` of silence if the transcript looks complete, and after `eot_max_silence_ms`
     in any case;
  4. in a long turn (`backchannel_after_ms` of speech) a pause of `backchannel_pause_ms` after an
     incomplete-looking transcript (so not about to be an end of turn) gets a backchannel, at most one
     per `backchannel_gap_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.cascade.options import EAGERNESS, CascadeOptions
from models.speech.vad import WINDOW_SECONDS
from models.turns.words import (
    FINISHED,
    UNCLEAR,
    backchannel_word,
    clearly_backchannel,
    looks_complete,
    only_backchannel,
)

WINDOW_MS = WINDOW_SECONDS * 1000.0  # 32 ms per Silero window
OVERLAP_END_MS = 300  # silence that closes an overlap which never became a barge-in
# Silence after backchannel words at which a paused reply goes on (the overlap stays open till
# OVERLAP_END_MS: speech again pauses it again). Three Silero windows: past the VAD's own off-delay,
# so a reply paused for "yeah." resumes one micro-turn sooner than the overlap's close would allow.
RESUME_MS = 96


@dataclass
class TurnState:
    """One session's policy state; every duration is media time in ms."""

    now_ms: float = 0.0  # media time at the end of the last observed window
    in_speech: bool = False  # VAD hysteresis state of the latest window
    speech_run_ms: float = 0.0  # length of the current run of speech windows
    silence_ms: float = 0.0  # length of the current run of silent windows
    turn: bool = False  # the user has an open turn (onset seen, no end yet)
    overlap: bool = False  # that turn began over the assistant and is not (yet) a barge-in
    paused: bool = False  # the overlap has enough speech that the assistant holds its audio
    announced: bool = False  # speech_started was emitted for this turn
    turn_speech_ms: float = 0.0  # speech so far in the open turn
    turn_started_ms: float = 0.0  # media time the open turn began
    last_backchannel_ms: float = -1e9  # media time of our last backchannel
    backchanneled_pause: bool = False  # already backchanneled in the current pause


@dataclass
class PauseCues:
    """What is known, at this micro-turn, about whether the current pause ends the user's turn."""

    p_end: float | None = None  # Smart Turn's P(end of turn); None until its answer is due
    words: str | None = None  # what the turn's words say (words.verdict: finished / unclear / unfinished;
    # Whisper's transcript, or the streaming one's last word without Whisper); None until due
    p_text: float | None = None  # the text model's P(the words are finished); None without it


@dataclass
class Decision:
    onset: bool = False  # a user turn opened this micro-turn (start the recogniser)
    resumed: bool = False  # the user spoke again (cut any backchannel we are playing)
    speech_started: bool = False  # announce the user's turn (a normal turn, or a confirmed barge-in)
    barge_in: bool = False  # stop the assistant now and drop the rest of its utterance
    abandon: bool = False  # the overlap was only a backchannel/echo: forget it, keep talking
    end_of_turn: bool = False  # the user finished: reply
    backchannel: bool = False  # say a short acknowledgment now


class TurnPolicy:
    def __init__(self, opts: CascadeOptions, smart_turn: bool = False) -> None:
        self.o = opts
        self.smart_turn = smart_turn  # P(end) comes from Smart Turn (else the fixed silence rule)
        self.eot_threshold, self.eot_max_ms = EAGERNESS[opts.eagerness]

    def turn_ends(self, s: TurnState, partial: str, cues: PauseCues) -> bool:
        """The dynamic end-of-turn rule (with Smart Turn), or the fixed silence rule (without).

        With Smart Turn the silence that ends a turn depends on what the pause's cues say. Both are
        asked at the same pause check and due a micro-turn or two later: Smart Turn's P(end) (prosody)
        and the verdict of the turn's words (Whisper's punctuated transcript, or the streaming one
        without Whisper); "agree" is P(end) >= the eagerness' threshold:
          - the words end a sentence: now if Smart Turn agrees, else after `eot_unsure_ms`;
          - unclear words (no closing punctuation): after `eot_unsure_ms` if Smart Turn agrees;
          - unfinished words ("... because"), or none of the above: the eagerness' maximum.
        The text model (`cues.p_text`, when there is one) has already judged the words (words.verdict:
        cut short under `text_open` whatever Whisper punctuated, able to end at `text_done` whatever
        their last word); at `text_done` or above it also counts as Smart Turn agreeing.
        Measured on synthetic voices, Smart Turn alone separates poorly (P(end) >= 0.5 for half the
        finished questions and half the mid-sentence pauses: 0.98 after "What I really want to know
        is"), so it never ends a turn against the words; the words alone cannot tell a lead-in
        sentence from the last one, which is what the prosody (and the wait) is for.
        """
        o = self.o
        if not self.smart_turn:
            return s.silence_ms >= o.eot_max_silence_ms or (
                s.silence_ms >= o.eot_silence_ms and looks_complete(partial)
            )
        if s.silence_ms >= self.eot_max_ms:
            return True
        agree = cues.p_end is not None and cues.p_end >= self.eot_threshold
        done = cues.p_text is not None and cues.p_text >= o.text_done
        if cues.words == FINISHED:
            return agree or done or s.silence_ms >= o.eot_unsure_ms
        if cues.words == UNCLEAR:
            return (agree or done) and s.silence_ms >= o.eot_unsure_ms
        return False

    def _said_stop(self, p_interrupt: float | None, overlap_words: str | None, echo_like: bool) -> bool:
        """Rule 2d: an overlap that has fallen silent was an interruption, not a backchannel, when both
        cues say so: the probe heard an interruption, and the words of the whole overlap (Whisper's
        last transcript, which by now holds all of it) are neither backchannels nor our echo. Either
        cue alone errs on short utterances: the probe pauses about one backchannel in five, and
        Whisper tiny reads some hums as words, often sure of them ("of course" as "i'm close" at a mean
        log probability per token over -1, Whisper's own bar for a failed decode). `python -m
        bench.overlap_handling`: the probe or words Whisper is sure of cut 12 of 59 backchannels, the probe's
        agreement 5."""
        if not overlap_words or only_backchannel(overlap_words) or echo_like:
            return False
        return p_interrupt is not None and p_interrupt >= self.o.barge_in_early_p

    def observe(self, s: TurnState, probs: npt.NDArray[np.float32], assistant_busy: bool) -> Decision:
        """Advance the VAD counters by this micro-turn's windows; open a turn on a speech onset."""
        d = Decision()
        for p in probs:
            s.now_ms += WINDOW_MS
            speech = p >= self.o.vad_on or (s.in_speech and p >= self.o.vad_off)
            s.in_speech = bool(speech)
            if speech:
                if s.silence_ms > 0:
                    s.backchanneled_pause = False
                s.speech_run_ms += WINDOW_MS
                s.silence_ms = 0.0
                if s.turn:
                    s.turn_speech_ms += WINDOW_MS
                    if s.speech_run_ms >= self.o.min_speech_ms:
                        d.resumed = True
                elif s.speech_run_ms >= self.o.min_speech_ms:
                    d.onset = True
                    s.turn, s.overlap, s.announced, s.paused = True, assistant_busy, False, False
                    s.turn_speech_ms = s.speech_run_ms
                    s.turn_started_ms = s.now_ms - s.speech_run_ms
            else:
                s.speech_run_ms = 0.0
                s.silence_ms += WINDOW_MS
        return d

    def decide(
        self,
        s: TurnState,
        d: Decision,
        partial: str,
        assistant_busy: bool,
        echo_like: bool,
        cues: PauseCues | None = None,
        bystander: bool = False,
        p_interrupt: float | None = None,
        overlap_words: str | None = None,
    ) -> Decision:
        """Given the partial transcript of the open turn, decide what happens this micro-turn.

        `cues`: what the end-of-turn models said about the current pause (see `turn_ends`);
        `bystander`: the turn is someone else's speech, not the user's (a level judgement);
        `p_interrupt`: the overlap probe's P(the overlap is an interruption), once it has been asked;
        `overlap_words`: the overlap's latest non-empty transcript (Whisper's), once there is one.
        """
        o = self.o
        if not s.turn:
            return d
        if s.overlap:
            if not assistant_busy:
                s.overlap = False  # the assistant finished on its own: a normal turn now
            elif s.silence_ms >= OVERLAP_END_MS:
                if bystander or not self._said_stop(p_interrupt, overlap_words, echo_like):
                    d.abandon = True
                    s.turn = s.overlap = s.paused = False
                    return d
                # A short interruption ("Stop.", "Hold on.") that has been said and is waiting for
                # us: the floor is the user's (rule 2d).
                d.barge_in = True
                s.overlap = s.paused = False
            elif bystander:
                s.paused = False  # not the user: the assistant goes on (resumes if it had paused)
            else:
                # Time since the overlap began: it is still alive, so its pauses were short
                # (< OVERLAP_END_MS) and belong to it ("Wait, stop.").
                spoken = s.now_ms - s.turn_started_ms
                # Single letters are how pocketsphinx spells hums ("mm-hm" -> "m m h"): not words.
                content = [w for w in partial.split() if len(w) > 1 and not backchannel_word(w)]
                words_ok = 0 < o.barge_in_words <= len(content) and not echo_like
                # What the overlap's words say so far (rule 2c): only backchannels give it twice as long
                # before it counts as a barge-in; clearly a backchannel also holds off the pause by length.
                only_bc = clearly_bc = False
                if overlap_words is not None and only_backchannel(overlap_words):
                    only_bc, clearly_bc = True, clearly_backchannel(overlap_words)
                longest = o.barge_in_max_ms * (2 if only_bc else 1)
                # Speech, not span: a pause inside the overlap must not count towards it.
                by_length = bool(o.barge_in_pause_ms) and s.turn_speech_ms >= o.barge_in_pause_ms
                by_probe = p_interrupt is not None and p_interrupt >= o.barge_in_early_p
                if spoken >= longest or (spoken >= o.barge_in_ms and words_ok):
                    d.barge_in = True
                    s.overlap = s.paused = False
                elif clearly_bc or (only_bc and s.silence_ms >= RESUME_MS):
                    # A pause taken on a misheard half word ("oh, wh-" read "oh why") or by the probe
                    # ends when the next transcript reads backchannels again: at once when they are
                    # clearly one, else once the user has stopped ("okay." but not "okay, but").
                    s.paused = False
                elif by_length or by_probe:
                    # Sooner when what is being said sounds like an interruption (rule 2a). The probe
                    # hears the overlap's first 100-300 ms and pauses about one backchannel in five:
                    # the words, a micro-turn later, overrule it (rule 2c).
                    s.paused = True
        if s.overlap:
            return d
        if not s.announced:
            s.announced = d.speech_started = True
        cues = cues or PauseCues()
        if self.turn_ends(s, partial, cues):
            d.end_of_turn = True
            s.turn = False
            return d
        if (
            o.backchannel
            and not bystander  # no "mm-hm" to the television
            and s.silence_ms >= o.backchannel_pause_ms
            # A pause whose words look finished is about to be our turn: no "mm-hm" right before it.
            and cues.words not in (FINISHED, UNCLEAR)
            and (cues.words is not None or not looks_complete(partial))
            and (cues.p_end is None or cues.p_end < self.eot_threshold)
            and not s.backchanneled_pause
            and s.turn_speech_ms >= o.backchannel_after_ms
            and s.now_ms - s.last_backchannel_ms >= o.backchannel_gap_ms
        ):
            d.backchannel = True
            s.backchanneled_pause = True
            s.last_backchannel_ms = s.now_ms
        return d
