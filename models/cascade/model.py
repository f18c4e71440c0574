"""The cascade interaction model: VAD + ASR + turn-taking policy + TTS, stepped every micro-turn.

Per micro-turn and session (`CascadeModel.step` runs all sessions of a tick together):
  1. front end: 24 kHz input -> 16 kHz, minus the echo of what this session played (aec.py);
  2. Silero VAD for all sessions as one batch per 32 ms window position (models.speech.vad);
  3. the policy (policy.py) opens/closes user turns and decides barge-in, replies and backchannels;
     pocketsphinx streams partials only while a user turn is open, decoded in worker processes and
     used one micro-turn after their audio (sphinx_remote); Smart Turn (end of turn) and
     Whisper (the final transcript) run on worker threads and are used a fixed number of
     micro-turns after they are asked (work.py), so media and real-time pace agree;
  4. the speaker (speaker.py) cuts one micro-turn of the assistant's queued speech; synthesis runs on
     the model's own worker threads, never inside `step`.
The user's finished utterance becomes `Event("delegate", {"query": ...})` in the micro-turn the turn ends
(the Whisper transcript of the pause that ended it; of a turn longer than the pause audio, `whisper_ticks`
micro-turns later), while a short acknowledgment is said at once; the background's answer
comes back as `TickInput.background` chunks and is spoken sentence by sentence as it arrives.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.base import BackgroundChunk, Event, TickInput, TickOutput
from models.cascade.aec import EchoCanceller
from models.cascade.level import SpeechLevel
from models.cascade.options import CascadeOptions
from models.cascade.policy import PauseCues, TurnPolicy, TurnState
from models.cascade.speaker import Speaker, Synthesizer
from models.cascade.text import (
    FINISHED,
    UNCLEAR,
    UNFINISHED,
    SentenceSplitter,
    looks_complete,
    only_backchannel,
    verdict,
    words_of,
)
from models.cascade.work import LATE, Job, StepClock, Workers
from models.speech.asr import (
    ASR_RATE,
    DecoderPool,
    Recognizer,
    SphinxRecognizer,
    Transcript,
    WhisperTranscriber,
    shared_pool,
    whisper_available,
)
from models.speech.overlap import OverlapProbe, OverlapProbeError, onset_index
from models.speech.smart_turn import SmartTurn, SmartTurnError, shared_smart_turn
from models.speech.sphinx_remote import RemoteSphinxRecognizer, SphinxProcesses
from models.speech.text_turn import TextTurn, TextTurnError
from models.speech.vad import VADStream, shared_vad
from streaming.resample import StreamResampler
from streaming.types import SAMPLE_RATE, Audio

_ECHO_MEMORY_MS = 10_000  # how long the assistant's words count as possible echo
_TURN_AUDIO_TICKS = 150  # 30 s: the longest turn kept for Whisper's final transcript
# A pocketsphinx utterance grows its search tables with its length and a pooled decoder keeps them
# (measured: ~25 MB per decoder over 140 s of continuous speech), so a turn that never ends would
# grow every decoder it touches. Past this many micro-turns the utterance is ended and a new one
# started; the words heard so far are carried in `CascadeState.heard`.
_UTTERANCE_TICKS = 150
# What a pause is judged on: Smart Turn reads the last 8 s, and Whisper's verdict on the pause (does the
# transcript end a sentence?) needs no more; transcribing a whole long turn at every pause cost up to
# ~2 s of a core per call and queued Whisper jobs far past their budget in the cascade soak.
_PAUSE_AUDIO_TICKS = 40
# Mostly-speech micro-turns a turn needs before its level says whose voice it is (`_someone_else`).
_LEVEL_TICKS = 2
log = logging.getLogger(__name__)


def _rounded(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _joined(earlier: str, text: str) -> str:
    return f"{earlier} {text}".strip() if earlier else text


@dataclass
class Heard:
    """What a Whisper job heard: its transcript and, when asked, the text model's P(the words are finished)."""

    transcript: Transcript
    p_text: float | None = None


def _pause_audio(s: CascadeState) -> Audio:
    """The end of the open turn that a pause is judged on (built only when a job is asked)."""
    recent = list(itertools.islice(s.turn_audio, max(0, len(s.turn_audio) - _PAUSE_AUDIO_TICKS), None))
    return np.concatenate(recent) if recent else np.zeros(0, dtype=np.float32)


@dataclass
class CascadeState:
    """Everything one session keeps between micro-turns. Created by `open`, freed by `close`."""

    session_id: str
    mic: StreamResampler  # user audio 24 kHz -> 16 kHz
    ref: StreamResampler  # assistant audio 24 kHz -> 16 kHz, the echo reference
    echo: EchoCanceller  # subtracts the assistant's own voice from the user's input
    vad: VADStream  # Silero recurrent state and leftover samples
    asr: Recognizer  # holds a pooled decoder only while a user turn is open
    turn: TurnState  # the policy's counters
    speaker: Speaker  # the assistant's queued phrases
    preroll: deque[Audio] = field(default_factory=deque)  # recent cleaned 16 kHz ticks (ASR pre-roll)
    turn_audio: deque[Audio] = field(default_factory=deque)  # the open turn's cleaned 16 kHz ticks
    turn_level: SpeechLevel = field(default_factory=SpeechLevel)  # the open turn's speech level so far
    user_db: float | None = None  # the user's own speech level (their delegated turns), dBFS
    eot_job: Job[float] | None = None  # Smart Turn asked in the current pause, not yet due
    text_job: Job[Heard] | None = None  # Whisper (and the text model) on the turn so far, asked in the current pause
    cues: PauseCues = field(default_factory=PauseCues)  # what those said, once due
    pause_text: Transcript | None = None  # Whisper's transcript of the turn up to the current pause
    pause_whole: bool = True  # pause_text covers the whole turn (not only its last `_PAUSE_AUDIO_TICKS`)
    pause_start: float | None = None  # media time the asked pause began (None: this pause not asked yet)
    final_job: Job[Heard] | None = None  # Whisper on the last finished turn, not yet due
    final_fallback: str = ""  # pocketsphinx's transcript of that turn (used if Whisper fails)
    partial: str = ""  # partial transcript of the open user turn
    heard: str = ""  # words of the open turn's earlier utterances (see `_UTTERANCE_TICKS`)
    utterance_ticks: int = 0  # micro-turns of audio sent into the current utterance
    heard_samples: int = 0  # 16 kHz samples of input so far (places the VAD's onset in `turn_audio`)
    p_interrupt: float | None = None  # the overlap probe's P(interruption) of the open overlap, once asked
    overlap_job: Job[Heard] | None = None  # Whisper on the open overlap so far, not yet due
    overlap_heard_ms: float = 0.0  # the overlap's speech (TurnState.turn_speech_ms) when that job was asked
    overlap_words: str | None = None  # the latest non-empty transcript of the open overlap
    said: deque[tuple[float, list[str]]] = field(default_factory=deque)  # (media ms, words) we spoke
    seen: set[str] = field(default_factory=set)  # background request ids seen so far
    muted: set[str] = field(default_factory=set)  # request ids whose further chunks are dropped
    max_epoch: int = 0  # newest background epoch seen; older chunks are stale
    splitters: dict[str, SentenceSplitter] = field(default_factory=dict)  # per streaming request
    acks: int = 0  # acknowledgments said (rotates the phrase)
    backchannels: int = 0  # backchannels said (rotates the phrase)
    ticks: int = 0  # micro-turns stepped


class CascadeModel:
    """An `InteractionModel` from offline components; one instance serves every session."""

    name = "cascade"
    max_sessions: int | None = None  # no KV memory: CPU time is the limit (see bench.engine)

    def __init__(self, opts: CascadeOptions | None = None) -> None:
        self.opts = o = opts or CascadeOptions()
        self.max_sessions = o.max_sessions or None
        self.vad = shared_vad()
        # Streaming partials (and the fallback transcript): in worker processes, or in this one.
        self._procs: SphinxProcesses | None = None
        self._pool: DecoderPool | None = None
        use_whisper = o.asr == "whisper" or (o.asr == "auto" and whisper_available())
        # With Whisper making final transcripts, partials only feed cues: the cheaper search.
        config = "partials" if use_whisper else "streaming"
        if o.asr_processes > 0:
            self._procs = SphinxProcesses(o.asr_processes, o.decoders_per_process(), config)
        else:
            self._pool = shared_pool(config, size=o.decoders_per_process())
        # Loaded here so a missing model fails at load, not at the first utterance.
        self.whisper = WhisperTranscriber(o.whisper_dir, workers=o.whisper_workers) if use_whisper else None
        self.smart_turn: SmartTurn | None = None
        if o.smart_turn:
            try:
                self.smart_turn = shared_smart_turn()
            except SmartTurnError as e:  # degrade to the fixed silence rule, loudly
                log.warning("Smart Turn unavailable, ending turns on silence alone: %s", e)
        # The words' own verdict (models.speech.text_turn): a small language model on Whisper's transcript.
        self.text_turn: TextTurn | None = None
        if o.text_turn and self.whisper is not None and self.smart_turn is not None:
            try:
                self.text_turn = TextTurn(contexts=o.whisper_workers)
            except TextTurnError as e:
                log.warning("text end-of-turn model unavailable, judging words by their last word: %s", e)
        # Interruption or backchannel, from the first few hundred ms of an overlap (models.speech.overlap).
        self.overlap_probe: OverlapProbe | None = None
        if o.barge_in_early_ms and self.whisper is not None:
            try:
                self.overlap_probe = OverlapProbe(self.whisper)
            except OverlapProbeError as e:
                log.warning("overlap probe unavailable, pausing for overlaps by their length alone: %s", e)
            mismatch = self.overlap_probe.mismatch(o.barge_in_early_ms) if self.overlap_probe else None
            if mismatch:
                log.warning("%s", mismatch)
        self.policy = TurnPolicy(o, smart_turn=self.smart_turn is not None)
        self.workers = Workers({"eot": o.eot_workers, "asr": o.whisper_workers})
        self.clock = StepClock(o.job_grace_ms / 1000)  # the tick thread's: the waits' shared grace, a slow step's why
        self.synth = Synthesizer(o.voice, o.fallback_voice, o.tts_workers)
        # Pre-rendered so that replies and backchannels start without waiting for synthesis.
        self.synth.prerender((*o.ack_phrases, *o.backchannel_phrases, o.error_phrase))
        self._warm_up()

    def _warm_up(self) -> None:
        """Pay the first-call costs (lazy allocations, ~1 s for Whisper) at load, not in the first
        sessions' micro-turns: in the cascade soak the first minute's jobs ran past their budget.

        Every call runs on each of its pool's own threads at once, twice, longest input first: each
        thread allocates from a heap arena of its own (glibc) and Whisper's workers keep buffers of
        their own, so a single call warmed one thread only, and a process running the same jobs took
        ~20-30 MB more at their second and later rounds. In a cascade soak the server's RSS stepped up
        by ~50 MB five minutes in and stayed there."""
        noise = (np.random.default_rng(0).standard_normal(ASR_RATE) * 0.01).astype(np.float32)
        smart_turn, whisper, text_turn = self.smart_turn, self.whisper, self.text_turn
        for _ in range(2):
            if smart_turn is not None:
                self.workers.on_every_thread("eot", lambda: smart_turn.probability(np.tile(noise, 8)))
            if whisper is not None:
                for seconds in (29, 19, 9):  # each window size Whisper decodes in (30, 20 and 10 s), largest first
                    clip = np.tile(noise, seconds)
                    self.workers.on_every_thread("asr", functools.partial(whisper.transcribe, clip))
            if text_turn is not None:
                self.workers.on_every_thread("asr", lambda: text_turn.probability("is this the end of a turn"))

    # --- lifecycle -------------------------------------------------------------------------------

    def open(self, session_id: str) -> CascadeState:
        o = self.opts
        asr: Recognizer = RemoteSphinxRecognizer(self._procs) if self._procs else SphinxRecognizer(self._pool)
        return CascadeState(
            session_id=session_id,
            mic=StreamResampler(SAMPLE_RATE, ASR_RATE),
            ref=StreamResampler(SAMPLE_RATE, ASR_RATE),
            echo=EchoCanceller(max_delay=o.echo_max_delay_ms * ASR_RATE // 1000, min_corr=o.echo_min_corr),
            vad=self.vad.open(ASR_RATE),
            asr=asr,
            turn=TurnState(),
            speaker=Speaker(self.synth, o.tts_budget_ms, o.tts_ms_per_char),
        )

    def close(self, state: CascadeState) -> None:
        state.asr.abort()  # returns a pooled decoder
        state.speaker.drop()

    def pending_work(self, s: CascadeState) -> list[Future[Any]]:
        """Off-thread work the session's next micro-turn uses (`models.base.OffThreadWork`): jobs due
        then, the partial of the audio sent last micro-turn, the next phrase's synthesis once due."""
        nxt = s.ticks + 1
        jobs = (s.eot_job, s.text_job, s.final_job, s.overlap_job)
        work: list[Future[Any]] = [j.future for j in jobs if j is not None and j.due <= nxt]
        work += s.asr.waiting()
        work += s.speaker.waiting()
        return work  # callers skip what is already done

    def wait_work(self, states: Sequence[CascadeState], timeout: float = 30.0) -> None:
        """Block until the off-thread work the next micro-turn of `states` uses is done.

        What the engine's media loop waits for (`pending_work`), for drivers that step the model
        directly and faster than real time (tests, offline evaluation): without it they would see
        the real-time fallbacks of an overloaded machine.
        """
        for s in states:
            for f in self.pending_work(s):
                with contextlib.suppress(CancelledError):
                    f.exception(timeout=timeout)

    def shutdown(self) -> None:
        """Stop the synthesis and worker threads (the model is unusable afterwards)."""
        self.synth.close()
        self.workers.close()
        if self._procs is not None:
            self._procs.close()

    # --- the micro-turn --------------------------------------------------------------------------

    def step_budget(self, seconds: float | None) -> None:
        """`models.base.StepBudget`: the coming step's waits for late work fit in what the engine allows."""
        self.clock.limit = seconds

    def step(self, batch: Sequence[tuple[CascadeState, TickInput]]) -> list[TickOutput]:
        c = self.clock
        c.start()
        # 1. front end, per session.
        with c.timed("front end"):
            clean = [s.echo.process(s.mic.process(t.audio)) for s, t in batch]
        # 2. VAD, batched across sessions.
        with c.timed("vad"):
            probs = self.vad.step([s.vad for s, _ in batch], clean)
        # 3-4. policy, recogniser and speaker, per session.
        outs = [self._tick(s, t, x, p) for (s, t), x, p in zip(batch, clean, probs, strict=True)]
        c.finish(len(batch))
        return outs

    def _tick(self, s: CascadeState, t: TickInput, x: Audio, probs: Audio) -> TickOutput:
        o = self.opts
        ev: list[Event] = []
        user_text = ""
        s.ticks += 1
        s.heard_samples += len(x)
        if t.cancel:
            self._stop(s, "cancel", ev)
        for text in t.text:
            user_text = self._typed(s, text, ev) or user_text
        for chunk in t.background:
            self._background(s, chunk, ev)
        if s.asr.active:
            # The partial of the audio sent last micro-turn is due now: the recogniser (a worker
            # process) decoded it while this thread did other sessions' micro-turns, so the tick
            # waits only if the worker is more than a micro-turn behind. The same one-micro-turn
            # delay in-process keeps both modes, and media and real-time pace, in agreement.
            with self.clock.timed("partial", wait=True):
                partial = s.asr.collect(self.clock.left())
            if s.asr.waiting():
                LATE.note("streaming partial")
            if s.utterance_ticks >= _UTTERANCE_TICKS:  # bounds the decoder's memory
                s.heard = self._end_utterance(s, _joined(s.heard, partial))
                s.asr.start()
                s.utterance_ticks = 0
                partial = ""
            partial = _joined(s.heard, partial)
            if partial != s.partial:
                s.partial = partial
                ev.append(Event("user_partial", {"text": partial}))

        user_text = self._take_final(s, ev) or user_text
        busy = s.speaker.busy
        d = self.policy.observe(s.turn, probs, busy)
        t0 = time.monotonic()
        if d.onset:
            s.asr.abort()
            s.asr.start()
            for past in s.preroll:
                s.asr.send(past, reply=False)
            s.partial = s.heard = ""
            s.utterance_ticks = len(s.preroll)
            s.turn_audio = deque(s.preroll)
            s.turn_level = SpeechLevel()
            s.p_interrupt = None
            self._forget_overlap_words(s)
            self._new_pause(s)
        if s.turn.turn:
            s.turn_audio.append(x)
            while len(s.turn_audio) > _TURN_AUDIO_TICKS:
                s.turn_audio.popleft()
            # Only ticks that are mostly speech: one where speech begins or ends late in it is mostly
            # silence or the tail of a word, and an overlap's first such tick made it look like background.
            if len(probs) and float(np.mean(probs >= o.vad_on)) >= 0.5:
                s.turn_level.add(x)
            s.asr.send(x)
            s.utterance_ticks += 1
        self.clock.add("asr send", t0)
        if d.resumed and s.speaker.playing_backchannel:
            s.speaker.drop(("backchannel",))  # never talk over the user
        s.preroll.append(x)
        while len(s.preroll) * 200 > o.preroll_ms:
            s.preroll.popleft()

        cues = self._pause_cues(s)
        quieter = self._background_level(s, s.turn_level.db)  # the level so far, even of one tick
        background = self._someone_else(s, quieter)
        # Sounds like the user so far (even on one tick, before `_someone_else` will say): an
        # interruption or a backchannel? Asked without waiting for the level's verdict (a pause it
        # brings is resumed when the verdict is background).
        sounds_like_user = not quieter
        if sounds_like_user:
            self._judge_overlap(s)
        self._hear_overlap(s, sounds_like_user)
        if s.turn.overlap and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "overlap at %.0f ms: %.0f ms speech, level %s dB over %d ticks (user %s), background %s, "
                "P(interruption) %s, words %r",
                s.turn.now_ms, s.turn.turn_speech_ms, _rounded(s.turn_level.db, 1), s.turn_level.ticks,
                _rounded(s.user_db, 1), background,
                _rounded(s.p_interrupt, 2), s.overlap_words,
            )
        # Echo: either transcript of the overlap holds only words the assistant itself said.
        echo = self._echo_like(s, s.partial) or (s.overlap_words is not None and self._echo_like(s, s.overlap_words))
        d = self.policy.decide(
            s.turn, d, s.partial, busy, echo, cues, bool(background), s.p_interrupt, s.overlap_words
        )
        if d.speech_started:
            ev.append(Event("speech_started", {"audio_ms": round(s.turn.turn_started_ms)}))
        if d.barge_in:
            self._stop(s, "barge_in", ev)
        if d.abandon:
            s.asr.abort()
            s.partial = s.heard = ""
        if d.end_of_turn:
            user_text = self._end_of_turn(s, ev) or user_text
        if d.backchannel:
            phrase = o.backchannel_phrases[s.backchannels % len(o.backchannel_phrases)]
            s.backchannels += 1
            s.speaker.say(phrase, "backchannel")
            ev.append(Event("backchannel", {"text": phrase}))

        # While the user holds a normal turn, or may be interrupting (a paused overlap), answers
        # wait where they are; only backchannels may play. Talk much quieter than the user's own (a
        # television that starts between our acknowledgment and the answer) holds nothing: the answer
        # would otherwise wait for the next pause in it.
        hold = s.turn.turn and (not s.turn.overlap or s.turn.paused) and not background
        with self.clock.timed("synthesis", wait=True):
            speech = s.speaker.tick(hold=hold, grace=self.clock.left())
        s.echo.played(s.ref.process(speech.audio))
        for p in speech.started:
            s.said.append((s.turn.now_ms, words_of(p.text)))
        while s.said and s.said[0][0] < s.turn.now_ms - _ECHO_MEMORY_MS:
            s.said.popleft()
        return TickOutput(audio=speech.audio, text=speech.text, user_text=user_text, events=ev)

    # --- actions ---------------------------------------------------------------------------------

    def _end_utterance(self, s: CascadeState, words: str) -> str:
        """End the recogniser's utterance; returns the turn's words through it (`words`: as the
        partials have them, `s.heard` and the latest partial).

        With Whisper making the final transcripts, pocketsphinx's words are only a fallback and a cue,
        so the latest partial (a micro-turn old) stands in for its final search: that search runs
        90-140 ms in the worker process while the tick waits for it, and in the conversational
        cascade soak it was what made steps miss their deadline ("slow cascade step: 197 ms
        (pocketsphinx final 137 ms, ...)"). Without Whisper the final is the question: waited for."""
        if self.whisper is not None:
            s.asr.abort()
            return words
        with self.clock.timed("pocketsphinx final"):
            return _joined(s.heard, s.asr.finish().text)

    def _end_of_turn(self, s: CascadeState, ev: list[Event]) -> str:
        text = self._end_utterance(s, s.partial)
        s.partial = s.heard = ""
        pause_text, text_job, whole = s.pause_text, s.text_job, s.pause_whole
        s.text_job = None  # kept (below) as the final transcript's job, not cancelled
        self._new_pause(s)
        ev.append(Event("speech_stopped", {"audio_ms": round(s.turn.now_ms - s.turn.silence_ms)}))
        level = s.turn_level.db
        if self._background_level(s, level):
            return ""  # someone else talking near the microphone, not a turn
        if s.turn.turn_speech_ms < self.opts.min_turn_speech_ms:
            return text  # noise
        # Whisper heard the whole turn at this pause: its words are the turn's; else pocketsphinx's.
        whole_text = pause_text.text if self.whisper is not None and pause_text is not None and whole else None
        words = text if whole_text is None else whole_text
        # A lone "mm-hm" while we wait, or no words at all (unless Whisper is still to hear the whole
        # turn): not a turn to answer; held answers go on.
        if only_backchannel(words) and (words or whole_text is not None or self.whisper is None):
            return words
        if level is not None:  # the user's own level, for telling background speech apart
            s.user_db = level if s.user_db is None else 0.7 * s.user_db + 0.3 * level
        if self.whisper is None:
            self._delegate(s, text, ev)
            return text
        if not whole and text_job is not None:
            text_job.future.cancel()  # the pause's transcript hears only the turn's end: transcribe it all
            text_job = None
        if whole_text is not None:
            self._delegate(s, words, ev)  # Whisper already heard this pause: ask now
            return words
        # Take the floor now (the acknowledgment starts this micro-turn); the question goes to the
        # background when Whisper's transcript is due, at most `whisper_ticks` micro-turns later.
        self._take_floor(s)
        if text_job is None:
            audio = np.concatenate(s.turn_audio) if s.turn_audio else np.zeros(0, dtype=np.float32)
            text_job = self.workers.submit("asr", s.ticks + self.opts.whisper_ticks, self._hear, audio, False)
        s.final_job, s.final_fallback = text_job, text
        return ""

    def _take_final(self, s: CascadeState, ev: list[Event]) -> str:
        """Delegate the Whisper transcript of the last turn once it is due; returns it."""
        if s.final_job is None:
            return ""
        with self.clock.timed("whisper", wait=True):
            due, heard = s.final_job.take(s.ticks, self.clock.left())
        if not due:
            return ""
        s.final_job = None
        text = heard.transcript.text if heard is not None and heard.transcript.text else s.final_fallback
        if only_backchannel(text):
            return text  # Whisper heard only "mm-hm": nothing to ask
        ev.append(Event("delegate", {"query": text}))
        return text

    def _new_pause(self, s: CascadeState) -> None:
        """Forget the cues of the last pause; jobs not started yet leave their worker's queue."""
        for job in (s.eot_job, s.text_job):
            if job is not None:
                job.future.cancel()
        s.eot_job, s.text_job, s.cues, s.pause_text, s.pause_whole = None, None, PauseCues(), None, True
        s.pause_start = None

    def _pause_cues(self, s: CascadeState) -> PauseCues:
        """Smart Turn and Whisper on the turn so far, both asked once per pause (after `eot_check_ms`
        of silence, or `eot_check_early_ms` when no off-thread job is in flight) and used at their due
        micro-turns: Smart Turn one later, Whisper `whisper_ticks`.

        Whisper decodes in a window sized to the pause's audio (at most 8 s), ~0.15 s of a core a call
        (models.speech.whisper_window), so it can hear every pause; its transcript is then also the
        final one when the pause ends the turn, and the question goes to the background at once.
        """
        t, o = s.turn, self.opts
        if self.smart_turn is None or not t.turn or t.overlap:
            return s.cues
        # A pause is known by when it began: talking (again) since the ask makes another one, asked
        # afresh (Smart Turn's answer too: without Whisper it is all a pause leaves behind).
        pause_start = t.now_ms - t.silence_ms
        if s.pause_start is not None and abs(pause_start - s.pause_start) > 1.0:
            self._new_pause(s)
        if s.pause_start is None:
            # The sooner ask puts a micro-turn more of jobs on the workers (gaps between words reach it
            # too): only when they have nothing else to do, so that a loaded machine keeps its sessions.
            early = o.eot_check_early_ms > 0 and self.workers.idle()
            if t.silence_ms < (o.eot_check_early_ms if early else o.eot_check_ms):
                return s.cues
            s.pause_start = pause_start
            audio = _pause_audio(s)
            s.eot_job = self.workers.submit("eot", s.ticks + 1, self.smart_turn.probability, audio)
            if self.whisper is not None:
                s.text_job = self.workers.submit("asr", s.ticks + o.whisper_ticks, self._hear, audio, True)
                s.pause_whole = len(s.turn_audio) <= _PAUSE_AUDIO_TICKS
            return s.cues
        if s.eot_job is not None:
            with self.clock.timed("smart turn", wait=True):
                due, p = s.eot_job.take(s.ticks, self.clock.left())
            if due:
                s.eot_job = None
                s.cues.p_end = 0.0 if p is None else p  # failed or late: no vote for "finished"
        if self.whisper is None:
            # No better transcript: the streaming one's last word; finished after the fixed rule's silence.
            complete = looks_complete(s.partial)
            s.cues.words = UNFINISHED if not complete else FINISHED if t.silence_ms >= o.eot_silence_ms else UNCLEAR
        elif s.text_job is not None:
            with self.clock.timed("whisper", wait=True):
                due, heard = s.text_job.take(s.ticks, self.clock.left())
            if due:
                s.text_job = None
                if heard is None:  # Whisper late (overloaded machine): the streaming transcript
                    raw = s.partial + "." if looks_complete(s.partial) else ""
                    heard = Heard(Transcript(s.partial, raw=raw))
                s.pause_text = heard.transcript
                s.cues.words = verdict(heard.transcript.raw, heard.p_text, o.text_open, o.text_done)
                s.cues.p_text = heard.p_text
        return s.cues

    def _judge_overlap(self, s: CascadeState) -> None:
        """Ask the overlap probe once per overlap, in the first micro-turn with `barge_in_early_ms` of its
        speech. Inline on the tick thread (~4 ms of Whisper's encoder, which releases the GIL): its
        answer is needed in this micro-turn, and overlaps are rare. A failure only loses the early cue."""
        t = s.turn
        if self.overlap_probe is None or not (t.turn and t.overlap) or s.p_interrupt is not None:
            return
        if t.turn_speech_ms < self.opts.barge_in_early_ms:
            return
        audio = np.concatenate(s.turn_audio)
        with self.clock.timed("overlap probe"):
            try:
                s.p_interrupt = self.overlap_probe.probability(
                    audio, onset_index(len(audio), s.heard_samples, t.turn_started_ms)
                )
            except Exception as e:  # never let a classifier stop a session
                log.warning("overlap probe failed (%s: %s); judging this overlap by its length", type(e).__name__, e)
                s.p_interrupt = 0.0

    def _hear_overlap(self, s: CascadeState, sounds_like_user: bool) -> None:
        """Whisper on the open overlap, asked every micro-turn whose speech has grown since the last ask
        (from `barge_in_early_ms` of it on) and used the micro-turn after, like every Whisper job.
        Its latest words (`s.overlap_words`) feed the policy's rule 2c. Overlaps are short and
        rare, so a few ~0.1 s transcriptions each; an overlap that already sounds like someone else's
        talk is not transcribed (it pauses nothing anyway)."""
        t, o = s.turn, self.opts
        if self.whisper is None or not o.overlap_words:
            return
        if not (t.turn and t.overlap):
            self._forget_overlap_words(s)
            return
        if s.overlap_job is not None:
            with self.clock.timed("whisper", wait=True):
                due, heard = s.overlap_job.take(s.ticks, self.clock.left())
            if due:
                s.overlap_job = None
                if heard is not None and heard.transcript.text:
                    s.overlap_words = heard.transcript.text
        if (
            s.overlap_job is None
            and t.turn_speech_ms >= o.barge_in_early_ms
            and t.turn_speech_ms > s.overlap_heard_ms
            and sounds_like_user
        ):
            s.overlap_heard_ms = t.turn_speech_ms
            s.overlap_job = self.workers.submit("asr", s.ticks + 1, self._hear, np.concatenate(s.turn_audio), False)

    def _forget_overlap_words(self, s: CascadeState) -> None:
        if s.overlap_job is not None:
            s.overlap_job.future.cancel()
        s.overlap_job, s.overlap_heard_ms, s.overlap_words = None, 0.0, None

    def _hear(self, audio: Audio, judge: bool) -> Heard:
        """Whisper's transcript of `audio` (on a worker thread); with `judge`, also the text model's
        P(finished) of its words, in the same job, so both are due at the same micro-turn."""
        assert self.whisper is not None
        transcript = self.whisper.transcribe(audio)
        if not judge or self.text_turn is None or not transcript.text:
            return Heard(transcript)
        return Heard(transcript, self.text_turn.probability(transcript.text))

    def _background_level(self, s: CascadeState, level: float | None) -> bool:
        """Speech this much quieter than the user's own is someone else's."""
        o = self.opts
        if level is None or s.user_db is None or o.background_db <= 0:
            return False
        return level < s.user_db - o.background_db

    def _someone_else(self, s: CascadeState, quieter: bool) -> bool | None:
        """The open turn (an overlap, or any turn) is someone else's talk: `quieter`, its speech level so
        far against the user's (`_background_level`), once it has `_LEVEL_TICKS` mostly-speech ticks;
        None before that: one tick is no level."""
        if not s.turn.turn:
            return False
        if s.turn_level.ticks < _LEVEL_TICKS:
            return None
        return quieter

    def _delegate(self, s: CascadeState, query: str, ev: list[Event]) -> None:
        self._take_floor(s)
        ev.append(Event("delegate", {"query": query}))

    def _take_floor(self, s: CascadeState) -> None:
        # A new question supersedes whatever answer is still pending or held back.
        s.speaker.drop()
        self._mute(s)
        if self.opts.ack and self.opts.ack_phrases:
            s.speaker.say(self.opts.ack_phrases[s.acks % len(self.opts.ack_phrases)], "ack")
            s.acks += 1

    def _typed(self, s: CascadeState, text: str, ev: list[Event]) -> str:
        text = text.strip()
        if not text:
            return ""
        s.final_job = None  # typed text supersedes a spoken question still being transcribed
        if self.opts.typed_text == "say":
            s.speaker.say(text, "say")
            return ""
        self._delegate(s, text, ev)
        return text

    def _stop(self, s: CascadeState, reason: str, ev: list[Event]) -> None:
        dropped = s.speaker.drop()
        self._mute(s)
        if dropped or reason == "cancel":
            ev.append(Event("yielded", {"reason": reason, "dropped": " ".join(p.text for p in dropped)}))

    def _mute(self, s: CascadeState) -> None:
        s.muted |= s.seen
        s.splitters.clear()

    def _background(self, s: CascadeState, c: BackgroundChunk, ev: list[Event]) -> None:
        if c.epoch < s.max_epoch or c.request_id in s.muted:
            return  # stale: superseded by a newer request, or interrupted
        s.max_epoch = c.epoch
        s.seen.add(c.request_id)
        splitter = s.splitters.setdefault(c.request_id, SentenceSplitter())
        sentences = splitter.push(c.text)
        if c.done or c.error:
            sentences += splitter.flush()
            del s.splitters[c.request_id]
        for sentence in sentences:
            s.speaker.say(sentence, "answer", c.request_id)
        if c.error:
            s.speaker.say(self.opts.error_phrase, "error", c.request_id)
            ev.append(Event("background_error", {"request_id": c.request_id, "error": c.error}))

    def _echo_like(self, s: CascadeState, partial: str) -> bool:
        """The overlapped words are all words the assistant itself said recently (its own echo)."""
        words = partial.split()
        if not words:
            return False
        recent = {w for _, ws in s.said for w in ws}
        return all(w in recent for w in words)
