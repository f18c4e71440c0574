"""The user's side of the open turn: its audio, and the words the recognisers hear in it.

pocketsphinx streams partial transcripts while a user turn is open: each micro-turn's audio is sent as
it comes and its partial is used one micro-turn later (the recogniser decodes in a worker process
while the tick thread steps other sessions; in-process recognisers keep the same delay, so that both,
and media and real-time pace, agree). Whisper (`Ears`, models/speech/ears.py) transcribes on worker
threads what the pause cues, the overlap handling and the finished turn ask for.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from models.speech.asr import Recognizer
from models.speech.ears import Heard
from models.turns.level import SpeechLevel
from models.turns.work import LATE, Job, StepClock
from streaming.types import Audio

_TURN_AUDIO_TICKS = 150  # 30 s: the longest turn kept for Whisper's final transcript
# A pocketsphinx utterance grows its search tables with its length and a pooled decoder keeps them
# (measured: ~25 MB per decoder over 140 s of continuous speech), so a turn that never ends would
# grow every decoder it touches. Past this many micro-turns the utterance is ended and a new one
# started; the words heard so far are carried in `HearingState.heard`.
_UTTERANCE_TICKS = 150


def joined(earlier: str, text: str) -> str:
    return f"{earlier} {text}".strip() if earlier else text


@dataclass
class HearingState:
    """One session's listening: the open turn's audio and transcripts, and the finished turn's final one."""

    asr: Recognizer  # pocketsphinx; holds a pooled decoder only while a user turn is open
    preroll: deque[Audio] = field(default_factory=deque)  # recent cleaned 16 kHz ticks (the ASR's pre-roll)
    audio: deque[Audio] = field(default_factory=deque)  # the open turn's cleaned 16 kHz ticks
    level: SpeechLevel = field(default_factory=SpeechLevel)  # the open turn's speech level so far
    samples: int = 0  # 16 kHz samples of input so far (places the VAD's onset in `audio`)
    partial: str = ""  # partial transcript of the open user turn
    heard: str = ""  # words of the open turn's earlier utterances (see `_UTTERANCE_TICKS`)
    utterance_ticks: int = 0  # micro-turns of audio sent into the current utterance
    final_job: Job[Heard] | None = None  # Whisper on the last finished turn, not yet due
    final_fallback: str = ""  # pocketsphinx's transcript of that turn (used if Whisper fails)

    def turn_audio(self) -> Audio:
        """All of the open turn's audio kept, as one array."""
        return np.concatenate(self.audio) if self.audio else np.zeros(0, dtype=np.float32)

    def collect(self, clock: StepClock, whisper: bool) -> str | None:
        """Take the partial of the audio sent last micro-turn; returns the turn's words so far when they
        changed. The recogniser decoded it while the tick thread did other sessions' micro-turns, so
        this waits only if the recogniser is more than a micro-turn behind."""
        if not self.asr.active:
            return None
        with clock.timed("partial", wait=True):
            partial = self.asr.collect(clock.left())
        if self.asr.waiting():
            LATE.note("streaming partial")
        if self.utterance_ticks >= _UTTERANCE_TICKS:  # bounds the decoder's memory
            self.heard = self.end_utterance(joined(self.heard, partial), clock, whisper)
            self.asr.start()
            self.utterance_ticks = 0
            partial = ""
        partial = joined(self.heard, partial)
        if partial == self.partial:
            return None
        self.partial = partial
        return partial

    def end_utterance(self, words: str, clock: StepClock, whisper: bool) -> str:
        """End the recogniser's utterance; returns the turn's words through it (`words`: as the
        partials have them, `heard` and the latest partial).

        With Whisper making the final transcripts (`whisper`), pocketsphinx's words are only a fallback
        and a cue, so the latest partial (a micro-turn old) stands in for its final search: that search
        runs 90-140 ms in the worker process while the tick waits for it, and in the conversational
        cascade soak it was what made steps miss their deadline ("slow cascade step: 197 ms
        (pocketsphinx final 137 ms, ...)"). Without Whisper the final is the question: waited for."""
        if whisper:
            self.asr.abort()
            return words
        with clock.timed("pocketsphinx final"):
            return joined(self.heard, self.asr.finish().text)

    def open_turn(self) -> None:
        """A user turn begins: a new utterance, fed the pre-roll first (the onset's first words are in it)."""
        self.asr.abort()
        self.asr.start()
        for past in self.preroll:
            self.asr.send(past, reply=False)
        self.partial = self.heard = ""
        self.utterance_ticks = len(self.preroll)
        self.audio = deque(self.preroll)
        self.level = SpeechLevel()

    def add(self, x: Audio, mostly_speech: bool) -> None:
        """One micro-turn of the open turn (cleaned, 16 kHz). Only ticks that are `mostly_speech` count
        towards its level: one where speech begins or ends late in it is mostly silence or the tail of
        a word, and an overlap's first such tick made it look like a bystander's."""
        self.audio.append(x)
        while len(self.audio) > _TURN_AUDIO_TICKS:
            self.audio.popleft()
        if mostly_speech:
            self.level.add(x)
        self.asr.send(x)
        self.utterance_ticks += 1

    def remember(self, x: Audio, preroll_ms: int) -> None:
        """Keep the last `preroll_ms` of input for the next turn's pre-roll."""
        self.preroll.append(x)
        while len(self.preroll) * 200 > preroll_ms:
            self.preroll.popleft()

    def abandon(self) -> None:
        """The open turn was not one (a backchannel or echo over the assistant): forget its words."""
        self.asr.abort()
        self.partial = self.heard = ""
