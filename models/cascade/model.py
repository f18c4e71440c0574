"""The cascade interaction model: VAD + ASR + turn-taking policy + TTS, stepped every micro-turn.

Per micro-turn and session (`CascadeModel.step` runs all sessions of a tick together):
  1. front end: 24 kHz input -> 16 kHz, minus the echo of what this session played (aec.py);
  2. Silero VAD for all sessions as one batch per 32 ms window position (models.speech.vad);
  3. the policy (policy.py) opens/closes user turns and decides barge-in, replies and backchannels,
     from what the streams hold: the streaming transcript (hearing.py: pocketsphinx partials, decoded
     in worker processes and used one micro-turn after their audio), the cues of a pause
     (pauses.py: Smart Turn and Whisper, on worker threads, used a fixed number of micro-turns after
     they are asked, work.py, so media and real-time pace agree) and of an overlap (overlaps.py),
     and whose voice it is (level.py);
  4. what the assistant says (answers.py) is cut into one micro-turn of speech (speaker.py); synthesis
     runs on the model's own worker threads, never inside `step`.
The user's finished utterance becomes `Event("delegate", {"query": ..., "ask": n})` in the micro-turn the turn ends
(the Whisper transcript of the pause that ended it; of a turn longer than the pause audio, `whisper_ticks`
micro-turns later), while a short acknowledgment is said at once; the background reasoner's answer
comes back as `TickInput.background` chunks and is spoken sentence by sentence as it arrives.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from models.base import Event, TickInput, TickOutput
from models.cascade.aec import EchoCanceller
from models.cascade.answers import AnswerState
from models.cascade.hearing import HearingState
from models.cascade.loading import CascadeParts
from models.cascade.options import CascadeOptions
from models.cascade.overlaps import log_overlap
from models.cascade.policy import Decision
from models.cascade.session import CascadeState
from models.cascade.sight import OFFER_WAIT_TICKS, offer_to_go_on, reply_to_offer
from models.speech.asr import ASR_RATE, Recognizer, SphinxRecognizer
from models.speech.speaker import Speaker
from models.speech.sphinx_remote import RemoteSphinxRecognizer
from models.turns.level import bystander_turn
from models.turns.words import only_backchannel
from streaming.resample import StreamResampler
from streaming.types import SAMPLE_RATE, TICK_SECONDS, Audio


class CascadeModel(CascadeParts):
    """An `InteractionModel` from offline components; one instance serves every session."""

    name = "cascade"
    max_sessions: int | None = None  # no KV memory: CPU time is the limit (see bench.engine_scaling)

    def __init__(self, opts: CascadeOptions | None = None) -> None:
        super().__init__(opts)  # the shared parts (loading.py)
        self.max_sessions = self.opts.max_sessions or None

    # --- lifecycle -------------------------------------------------------------------------------

    def open(self, session_id: str) -> CascadeState:
        o = self.opts
        asr: Recognizer = RemoteSphinxRecognizer(self._procs) if self._procs else SphinxRecognizer(self._pool)
        return CascadeState(
            session_id=session_id,
            mic=StreamResampler(SAMPLE_RATE, ASR_RATE),
            ref=StreamResampler(SAMPLE_RATE, ASR_RATE),
            aec=EchoCanceller(max_delay=o.echo_max_delay_ms * ASR_RATE // 1000, min_corr=o.echo_min_corr),
            vad=self.vad.open(ASR_RATE),
            hearing=HearingState(asr),
            answers=AnswerState(Speaker(self.synth, o.tts_budget_ms, o.tts_ms_per_char)),
        )

    def close(self, state: CascadeState) -> None:
        state.hearing.asr.abort()  # returns a pooled decoder
        state.answers.speaker.drop()
        self.sight.close(state.session_id)

    def pending_work(self, s: CascadeState) -> list[Future[Any]]:
        """Off-thread work the session's next micro-turn uses (`models.base.OffThreadWork`): jobs due
        then, the partial of the audio sent last micro-turn, the next phrase's synthesis once due."""
        nxt = s.tick + 1
        jobs = (s.pause.eot_job, s.pause.text_job, s.hearing.final_job, s.overlap.job)
        work: list[Future[Any]] = [j.future for j in jobs if j is not None and j.due <= nxt]
        work += s.hearing.asr.waiting()
        work += s.answers.speaker.waiting()
        work += self.sight.waiting(s.session_id)
        return work  # callers skip what is already done

    # --- the micro-turn --------------------------------------------------------------------------

    def step_budget(self, seconds: float | None) -> None:
        """`models.base.StepBudget`: the coming step's waits for late work fit in what the engine allows."""
        self.clock.limit = seconds

    def step(self, batch: Sequence[tuple[CascadeState, TickInput]]) -> list[TickOutput]:
        c = self.clock
        c.start()
        # 1. front end, per session.
        with c.timed("front end"):
            clean = [s.aec.process(s.mic.process(t.audio)) for s, t in batch]
        # 2. VAD, batched across sessions.
        with c.timed("vad"):
            probs = self.vad.step([s.vad for s, _ in batch], clean)
        # 3-4. policy, recogniser and speaker, per session.
        outs = [self._tick(s, t, x, p) for (s, t), x, p in zip(batch, clean, probs, strict=True)]
        c.finish(len(batch))
        return outs

    def _tick(self, s: CascadeState, t: TickInput, x: Audio, probs: Audio) -> TickOutput:
        """One session's micro-turn: `x` is its cleaned 16 kHz input, `probs` its VAD windows' P(speech)."""
        o, h, a = self.opts, s.hearing, s.answers
        ev: list[Event] = []
        user_text = ""
        s.tick += 1
        h.samples += len(x)
        # 1. What the client sent: cancel, the camera, typed text, and the reasoner's answer as it streams in.
        if t.cancel:
            a.stop("cancel", ev)
        if o.vision:
            self._see(s, t, ev)
        for text in t.text:
            user_text = self._typed(s, text, ev) or user_text
        for chunk in t.background:
            a.add_chunk(chunk, o.error_phrase, ev)
        # 2. What was heard: the partial of the audio sent last micro-turn; a finished turn's Whisper
        # transcript, once due, goes to the reasoner.
        partial = h.collect(self.clock, self.ears is not None)
        if partial is not None:
            ev.append(Event("user_partial", {"text": partial}))
        user_text = self._take_final(s, ev) or user_text
        # 3. This micro-turn's speech: does a user turn open? The open turn's audio goes to the recogniser.
        # An answer held on an offer to go on does not make the reply an overlap: the reply is a turn.
        busy = a.speaker.busy and s.sight.offered is None
        d = self.policy.observe(s.turn, probs, busy)
        self._listen(s, d, x, probs)
        # 4. The evidence: the pause's end-of-turn cues; whose voice the turn is; what an overlap says.
        cues = self.pauses.cues(o, s.pause, s.turn, s.tick, h)
        quieter = s.user.quieter(h.level.db, o.background_db)  # the level so far, even of one tick
        bystander = bystander_turn(s.turn.turn, h.level, quieter)
        # Sounds like the user so far (even on one tick, before `bystander_turn` will say): an
        # interruption or a backchannel? Asked without waiting for the level's verdict (a pause it
        # brings is resumed when the verdict is bystander).
        sounds_like_user = not quieter
        if sounds_like_user:
            self.overlaps.probe_once(o, s.overlap, s.turn, h)
        self.overlaps.hear(o, s.overlap, s.turn, s.tick, h, sounds_like_user)
        log_overlap(s.overlap, s.turn, h, s.user.db, bystander)
        # Echo: either transcript of the overlap holds only words the assistant itself said.
        words = s.overlap.words
        echo = a.said_lately(h.partial) or (words is not None and a.said_lately(words))
        # 5. The decision, and what it does.
        d = self.policy.decide(s.turn, d, h.partial, busy, echo, cues, bool(bystander), s.overlap.p_interrupt, words)
        if d.speech_started:
            ev.append(Event("speech_started", {"audio_ms": round(s.turn.turn_started_ms)}))
        if d.barge_in:
            a.stop("barge_in", ev)
        if d.abandon:
            h.abandon()
        if d.end_of_turn:
            user_text = self._end_of_turn(s, ev) or user_text
        if d.backchannel:
            a.backchannel(o.backchannel_phrases, ev)
        self._release_questions(s, ev)
        # 6. Speak. While the user holds a normal turn, or may be interrupting (a paused overlap), answers
        # wait where they are; only backchannels may play. Talk much quieter than the user's own (a
        # television that starts between our acknowledgment and the answer) holds nothing: the answer
        # would otherwise wait for the next pause in it.
        hold = s.turn.turn and (not s.turn.overlap or s.turn.paused) and not bystander
        # The user left the picture mid-answer, or was offered to go on: it waits for them.
        hold = hold or s.sight.away or s.sight.offered is not None
        speech = a.speak(hold, s.turn.now_ms, self.clock)
        s.aec.played(s.ref.process(speech.audio))
        return TickOutput(audio=speech.audio, text=speech.text, user_text=user_text, events=ev)

    def _listen(self, s: CascadeState, d: Decision, x: Audio, probs: Audio) -> None:
        """Step 3 of `_tick`: a turn's onset starts a new one (recogniser, audio, cues); the open turn's
        audio is kept and sent to the recogniser; the user speaking again cuts our backchannel."""
        h, t0 = s.hearing, time.monotonic()
        if d.onset:
            h.open_turn()
            s.overlap.reset()
            s.pause.forget()
        if s.turn.turn:
            h.add(x, mostly_speech=bool(len(probs)) and float(np.mean(probs >= self.opts.vad_on)) >= 0.5)
        self.clock.add("asr send", t0)
        if d.resumed and s.answers.speaker.playing_backchannel:
            s.answers.speaker.drop(("backchannel",))  # never talk over the user
        h.remember(x, self.opts.preroll_ms)

    # --- a user turn's outcomes ------------------------------------------------------------------

    def _end_of_turn(self, s: CascadeState, ev: list[Event]) -> str:
        """The user's turn ended: ask the reasoner (now, or once Whisper's transcript is due), or not
        (a bystander, noise, a lone backchannel); returns the user's words to show, if any."""
        o, h, p = self.opts, s.hearing, s.pause
        text = h.end_utterance(h.partial, self.clock, self.ears is not None)
        h.partial = h.heard = ""
        pause_text, text_job, whole = p.text, p.text_job, p.whole
        p.text_job = None  # kept (below) as the final transcript's job, not cancelled
        p.forget()
        ev.append(Event("speech_stopped", {"audio_ms": round(s.turn.now_ms - s.turn.silence_ms)}))
        level = h.level.db
        if s.user.quieter(level, o.background_db):
            return ""  # a bystander talking near the microphone, not a turn
        if s.turn.turn_speech_ms < o.min_turn_speech_ms:
            return text  # noise
        # Whisper heard the whole turn at this pause: its words are the turn's; else pocketsphinx's.
        whole_text = pause_text.text if self.ears is not None and pause_text is not None and whole else None
        words = text if whole_text is None else whole_text
        if s.sight.offered is not None and (whole_text is not None or self.ears is None):
            self._offer_answered(s, words, ev)  # "yes", "no", or a new question
            return words
        # A lone "mm-hm" while we wait, or no words at all (unless Whisper is still to hear the whole
        # turn): not a turn to answer; held answers go on.
        if only_backchannel(words) and (words or whole_text is not None or self.ears is None):
            return words
        if level is not None:  # the user's own level, for telling bystander speech apart
            s.user.learn(level)
        if o.vision:  # a question: with the camera on, it waits for a reading of the picture as it is now
            self.sight.ask(s.sight, s.tick)
        if self.ears is None:
            self._delegate(s, text, ev)
            return text
        if not whole and text_job is not None:
            text_job.future.cancel()  # the pause's transcript hears only the turn's end: transcribe it all
            text_job = None
        if whole_text is not None:
            self._delegate(s, words, ev)  # Whisper already heard this pause: ask now
            return words
        # Take the floor now (the acknowledgment starts this micro-turn); the question goes to the
        # reasoner when Whisper's transcript is due, at most `whisper_ticks` micro-turns later. A reply
        # to an offer to go on takes it only once its words say it is a new question.
        if s.sight.offered is None:
            s.answers.take_floor(o)
        if text_job is None:
            text_job = self.workers.submit("asr", s.tick + o.whisper_ticks, self.ears.hear, h.turn_audio(), False)
        h.final_job, h.final_fallback = text_job, text
        return ""

    def _take_final(self, s: CascadeState, ev: list[Event]) -> str:
        """Delegate the Whisper transcript of the last turn once it is due; returns it."""
        h = s.hearing
        if h.final_job is None:
            return ""
        with self.clock.timed("whisper", wait=True):
            due, heard = h.final_job.take(s.tick, self.clock.left())
        if not due:
            return ""
        h.final_job = None
        text = heard.transcript.text if heard is not None and heard.transcript.text else h.final_fallback
        if s.sight.offered is not None:
            self._offer_answered(s, text, ev)
            return text
        if only_backchannel(text):
            return text  # Whisper heard only "mm-hm": nothing to ask
        self._ask(s, text, ev)
        return text

    def _delegate(self, s: CascadeState, query: str, ev: list[Event]) -> None:
        s.answers.take_floor(self.opts)
        self._ask(s, query, ev)

    # --- the camera ------------------------------------------------------------------------------

    def _see(self, s: CascadeState, t: TickInput, ev: list[Event]) -> None:
        """Step 1 of `_tick`: offer the frame, take what was seen, act on cues that began."""
        a, sg = s.answers, s.sight
        # A spoken turn asks for a reading when it starts (often done by the time it ends) and again when
        # it ends (`_end_of_turn`: its question waits for that one); typed text asks and waits for it.
        if s.turn.turn and not sg.turn_read:
            sg.want_text = sg.turn_read = True
        sg.turn_read = sg.turn_read and bool(s.turn.turn)
        self.sight.look(s.session_id, sg, t.video, s.tick, question=bool(t.text))
        speaking = a.speaker.busy and not a.speaker.playing_backchannel
        offer_after = round(self.opts.resume_offer_s / TICK_SECONDS) if self.opts.resume_offer_s > 0 else None
        cues, stop = self.sight.see(s.session_id, sg, s.tick, speaking, offer_after)
        if stop:
            a.stop("visual_stop", ev)  # a hand held up: stop, as a spoken interruption would
        if sg.offer:  # back after a long absence: ask before going on with the held answer
            offer = offer_to_go_on(sg, a.speaker, self.opts.resume_offer_phrase, s.tick)
            ev += [offer] if offer is not None else []
        elif sg.offered is not None and not s.turn.turn and s.tick - sg.offered > OFFER_WAIT_TICKS:
            sg.offered = None  # no reply: the held answer is not forced on them
            a.stop("offer_unanswered", ev)
        # A still picture just read joins the conversation (its facts line), unless a question waits for
        # it: the question's own facts line carries it.
        picture = sg.picture_read and not sg.held and sg.asked is None and not t.text
        sg.picture_read = False
        # A nod while it speaks is a backchannel: it goes on (the cue is only reported).
        vision = self.sight.event(sg, cues, facts=picture)
        if vision is not None:
            ev.append(vision)

    def _offer_answered(self, s: CascadeState, words: str, ev: list[Event]) -> None:
        """The user replied to "shall I go on?": yes lifts the hold (the answer goes on from the start
        of its sentence), no drops the answer, anything else is a new question."""
        if not words.strip():
            return  # no words (noise): the offer still waits for a reply
        reply = reply_to_offer(words)
        s.sight.offered = None
        ev.append(Event("resume_reply", {"reply": reply, "text": words}))
        if reply == "no":
            s.answers.stop("declined", ev)
        elif reply == "other":
            if self.opts.vision:
                self.sight.ask(s.sight, s.tick)
            self._delegate(s, words, ev)

    def _ask(self, s: CascadeState, query: str, ev: list[Event]) -> None:
        """Delegate `query`, or hold it for the reading of the picture it may be about."""
        if s.sight.asked is not None:
            s.sight.held.append(query)
            return
        self._question(s, query, ev)

    def _release_questions(self, s: CascadeState, ev: list[Event]) -> None:
        sg = s.sight
        if sg.held and sg.asked is None:
            held, sg.held = sg.held, []
            for query in held:
                self._question(s, query, ev)

    def _question(self, s: CascadeState, query: str, ev: list[Event]) -> None:
        if s.sight.frame is not None:  # the camera is on: the reasoner is told what is in view
            vision = self.sight.event(s.sight, [], facts=True)
            if vision is not None:
                ev.append(vision)
            if s.sight.tracker.state.frames:  # its answer about what is seen is checked against the facts
                s.answers.ground(query, self.sight.facts(s.sight))
        ev.append(Event("delegate", {"query": query, "ask": s.answers.number_question()}))

    def _typed(self, s: CascadeState, text: str, ev: list[Event]) -> str:
        text = text.strip()
        if not text:
            return ""
        s.hearing.final_job = None  # typed text supersedes a spoken question still being transcribed
        if self.opts.typed_text == "say":
            s.answers.speaker.say(text, "say")
            return ""
        if s.sight.offered is not None:
            self._offer_answered(s, text, ev)
            return text
        self._delegate(s, text, ev)
        return text
