"""The cascade's offline parts, loaded once per process and shared by every session (models/cascade/model.py).

`CascadeParts` loads them (the recognisers' pool or worker processes, Whisper and its overlap-probe
replica, Smart Turn, the text end-of-turn model, the synthesiser with its pre-rendered phrases, the
camera, the worker threads), degrading loudly where an optional one is missing, and warms them up so
that their first-call costs are paid at load, not in the first sessions' micro-turns; `shutdown` stops
what they started.
"""

from __future__ import annotations

import functools
import logging

import numpy as np

from models.cascade.options import CascadeOptions
from models.cascade.overlaps import OverlapJudge
from models.cascade.pauses import PauseJudge
from models.cascade.policy import TurnPolicy
from models.cascade.sight import Sight
from models.speech.asr import ASR_RATE, DecoderPool, WhisperTranscriber, shared_pool, whisper_available
from models.speech.ears import Ears
from models.speech.overlap import OverlapProbe, OverlapProbeError
from models.speech.smart_turn import SmartTurn, SmartTurnError, shared_smart_turn
from models.speech.speaker import Synthesizer
from models.speech.sphinx_remote import SphinxProcesses
from models.speech.text_turn import TextTurn, TextTurnError
from models.speech.vad import shared_vad
from models.turns.work import StepClock, Workers

log = logging.getLogger(__name__)


class CascadeParts:
    """What every session of the cascade shares: loaded by `__init__`, stopped by `shutdown`."""

    def __init__(self, opts: CascadeOptions | None = None) -> None:
        self.opts = o = opts or CascadeOptions()
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
                # A Whisper replica of its own: the probe runs inline on the tick thread, and on the
                # transcribers' model it queued behind their transcriptions whenever both workers were
                # busy (measured at 6 sessions: 178-227 ms probe steps, each a missed deadline).
                probe_ears = WhisperTranscriber(o.whisper_dir, workers=1, replica="overlap probe")
                self.overlap_probe = OverlapProbe(probe_ears)
            except OverlapProbeError as e:
                log.warning("overlap probe unavailable, pausing for overlaps by their length alone: %s", e)
            mismatch = self.overlap_probe.mismatch(o.barge_in_early_ms) if self.overlap_probe else None
            if mismatch:
                log.warning("%s", mismatch)
        self.policy = TurnPolicy(o, smart_turn=self.smart_turn is not None)
        self.workers = Workers({"eot": o.eot_workers, "asr": o.whisper_workers})
        self.clock = StepClock(o.job_grace_ms / 1000)  # the tick thread's: the waits' shared grace, a slow step's why
        # Whisper's transcripts (with the text model's verdict where asked) for the pause and overlap cues.
        self.ears = Ears(self.whisper, self.text_turn) if self.whisper is not None else None
        self.pauses = PauseJudge(self.smart_turn, self.ears, self.workers, self.clock)
        self.overlaps = OverlapJudge(self.overlap_probe, self.ears, self.workers, self.clock)
        self.synth = Synthesizer(o.voice, o.fallback_voice, o.tts_workers)
        self.sight = Sight()  # its worker process starts with the first camera frame
        # Pre-rendered so that replies and backchannels start without waiting for synthesis.
        self.synth.prerender((*o.ack_phrases, *o.backchannel_phrases, o.error_phrase, o.resume_offer_phrase))
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
        silence = np.zeros(ASR_RATE, np.float32)
        smart_turn, whisper, text_turn = self.smart_turn, self.whisper, self.text_turn
        for _ in range(2):
            if smart_turn is not None:
                self.workers.on_every_thread("eot", lambda: smart_turn.probability(np.tile(noise, 8)))
            if whisper is not None:
                # Each window size Whisper decodes in (30, 20 and 10 s), largest first. The two long ones
                # hear digital silence: their encoder buffers are what is sized by the window, and
                # silence decodes to a word where noise decodes to the full 224 tokens (~5 s more per
                # call on a loaded core). The short one hears noise: its long decode sizes the
                # decoder's own buffers, which do not depend on the window.
                for seconds, sound in ((29, silence), (19, silence), (9, noise)):
                    clip = np.tile(sound, seconds)
                    self.workers.on_every_thread("asr", functools.partial(whisper.transcribe, clip))
            if text_turn is not None:
                self.workers.on_every_thread("asr", lambda: text_turn.probability("is this the end of a turn"))
            if self.overlap_probe is not None:
                self.overlap_probe.probability(noise, 0)

    def shutdown(self) -> None:
        """Stop the synthesis and worker threads (the model is unusable afterwards)."""
        self.synth.close()
        self.workers.close()
        self.sight.shutdown()
        if self._procs is not None:
            self._procs.close()
