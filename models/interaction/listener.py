"""The heard-words channel in serving: pocketsphinx streams the user's words into a native session.

Only for checkpoints with `heard_tokens` > 0 (heard.py has the rules, shared with training). Per
session, every micro-turn on the inference thread: collect the partial hypothesis of the audio sent
last micro-turn (decoded in an ASR worker process meanwhile, as the cascade does: sphinx_remote.py),
take its newest word as the channel's value (and commit the words that became final: a delegation's
query), and send this micro-turn's audio. The wait is for a worker more than a micro-turn behind only.
One worker process serves every session of the model; pocketsphinx decodes a session's audio at about
0.15-0.2x real time here, so past about five sessions a micro-turn, partials come late.

Training runs the same loop (`hear_track`) with an in-process recogniser over each episode's user
audio, so the model learns from the words pocketsphinx really gets, wrong ones included (espeak voices
come out mostly wrong), at the micro-turn it would get them.

The recogniser's utterance is kept open across pauses (pocketsphinx needs no VAD for partials) and
ended when its hypothesis has held still for `_QUIET_TICKS` (everything in it is committed by then),
or past `_UTTERANCE_TICKS` (a decoder's tables grow with its utterance: hearing.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from models.interaction.config import InteractionConfig
from models.interaction.heard import LastWord, WordCommitter, words_of
from models.speech.sphinx import ASR_RATE, ASRError, Recognizer, SphinxRecognizer, shared_pool
from models.speech.sphinx_remote import RemoteSphinxRecognizer, SphinxProcesses
from streaming.resample import StreamResampler
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, Audio

_QUIET_TICKS = 10  # 2 s of an unchanged hypothesis: the utterance is over, start a fresh one
_UTTERANCE_TICKS = 150  # 30 s: the longest utterance a decoder is kept in
CONFIG = "streaming"  # pocketsphinx search settings (sphinx.CONFIGS), the same in training and serving
# A step waits at most this long for its sessions' partials, all together; a session whose worker is
# later keeps its last partial and the late one is collected next micro-turn.
_COLLECT_TIMEOUT_S = 0.5
_KEEP_WORDS = 30  # committed words kept: a delegation's query


@dataclass
class HeardSession:
    asr: Recognizer
    word: LastWord  # the channel's value
    mic: StreamResampler = field(default_factory=lambda: StreamResampler(SAMPLE_RATE, ASR_RATE))
    committer: WordCommitter = field(default_factory=WordCommitter)
    ticks: int = 0  # micro-turns sent into the open utterance
    still: int = 0  # micro-turns its hypothesis has not changed
    partial: str = ""
    words: list[str] = field(default_factory=list)  # the last `_KEEP_WORDS` committed: a delegation's query
    fresh: list[str] = field(default_factory=list)  # committed since `take_fresh`: the user's transcript

    def commit(self, words: list[str]) -> None:
        self.words = (self.words + words)[-_KEEP_WORDS:]
        self.fresh += words

    def flush(self) -> None:
        """Commit what the open utterance's partial holds (the user's turn ended): the channel's bytes
        are untouched, so serving still reads exactly what training taught."""
        self.commit(self.committer.flush(self.partial))

    def take_fresh(self) -> str:
        """The words committed since the last call, as transcript text."""
        text, self.fresh = " ".join(self.fresh), []
        return text


class Listener:
    """Each session's recogniser: in ASR worker processes (serving), or in this process (`processes=0`:
    training's `hear_track`, where nothing else waits on the thread)."""

    @staticmethod
    def for_config(cfg: InteractionConfig) -> Listener | None:
        """The listener a model of `cfg` is served with: one worker process when it reads heard words."""
        return Listener(cfg.heard_tokens) if cfg.heard_tokens else None

    def __init__(self, width: int, processes: int = 1) -> None:
        self.width = width
        self.procs: SphinxProcesses | None = None
        if processes:
            try:
                # Two decoders built before it is ready (a session holds one while its utterance is open;
                # more are built on demand by the worker).
                self.procs = SphinxProcesses(processes, decoders=2, config=CONFIG)
            except ASRError as e:
                raise ASRError(f"this checkpoint reads the words a recogniser heard (heard_tokens > 0), and {e}") from e

    def open(self) -> HeardSession:
        asr: Recognizer = (RemoteSphinxRecognizer(self.procs) if self.procs is not None
                           else SphinxRecognizer(shared_pool(CONFIG)))
        return HeardSession(asr, LastWord(self.width))

    def step(self, sessions: Sequence[HeardSession], audio: Sequence[Audio]) -> list[list[int]]:
        """This micro-turn's channel bytes for each session (the partials of last micro-turn's audio,
        collected within one shared wait), then this micro-turn's audio sent to be decoded while the
        model steps."""
        deadline = time.monotonic() + _COLLECT_TIMEOUT_S
        rows = [self._heard(hs, deadline) for hs in sessions]
        for hs, a in zip(sessions, audio, strict=True):
            self._send(hs, a)
        return rows

    def _heard(self, hs: HeardSession, deadline: float) -> list[int]:
        if hs.asr.active:
            partial = hs.asr.collect(max(0.0, deadline - time.monotonic()))
            hs.still = hs.still + 1 if partial == hs.partial else 0
            hs.partial = partial
            hs.word.push(words_of(partial))  # the newest word heard, as soon as the partial has it
            hs.commit(hs.committer.update(partial))
            if hs.still >= _QUIET_TICKS or hs.ticks >= _UTTERANCE_TICKS:
                hs.commit(hs.committer.finish(partial))
                hs.asr.abort()  # no final transcript wanted: its words are the partial's
                hs.partial, hs.ticks, hs.still = "", 0, 0
        return hs.word.take()

    def _send(self, hs: HeardSession, audio: Audio) -> None:
        if not hs.asr.active:
            hs.asr.start()
        hs.asr.send(hs.mic.process(np.asarray(audio, dtype=np.float32)))
        hs.ticks += 1

    def close(self, hs: HeardSession) -> None:
        hs.asr.abort()

    def shutdown(self) -> None:
        if self.procs is not None:
            self.procs.close()


def hear_track(audio: Audio, width: int, listener: Listener | None = None) -> list[list[int]]:
    """The channel's bytes for each micro-turn of a 24 kHz track, as serving would feed them: training's,
    with an in-process recogniser unless `listener` is given."""
    listener = listener or Listener(width, processes=0)
    hs = listener.open()
    out = [listener.step([hs], [audio[t * TICK_SAMPLES : (t + 1) * TICK_SAMPLES]])[0]
           for t in range(len(audio) // TICK_SAMPLES)]
    listener.close(hs)
    return out

