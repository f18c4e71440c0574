"""The native model's Piper talker: its text stream spoken by the cascade's voice, in its own timing.

A thinker-talker split for checkpoints whose own voice (the flow head) has not earned its place: the
model still decides every micro-turn whether to speak, stay silent, backchannel, yield or delegate,
and writes what it says; `PiperTalker` turns that text into Piper joe audio (the voice the model was
trained to speak with) and plays it 200 ms per micro-turn. What it plays is what the model hears back
as its own channel (serving.py), exactly as with the flow head's audio.

Per micro-turn, after the model's decision (`turn`):
  speak        new words go to the speaker: a phrase the model has committed to (the phrase-constrained
               writer, phrases.py, sees only one allowed continuation) as one whole phrase, and each
               phrase it chains after it likewise, else free text up to its last clause mark or every
               few words
  yield/cancel the utterance stops within this micro-turn: queued and half-played audio is dropped
  silent, delegate  the model stopped writing: what it wrote (a committed phrase whole) plays to its end
  backchannel  a pre-rendered "Mm-hm." when nothing else is playing (the text stream has none for it)

Synthesis never runs on the inference thread: the closed phrase set is rendered once, on a thread of
its own started at load (~0.1-0.6 s a phrase on 2 shared cores: 22 phrases took 13-21 s at nice 19, too
long to hold start-up for, and competing with the first sessions' steps), and kept on disk
(`phrase_cache_dir`), so later starts load it in milliseconds; a phrase not rendered yet, and
anything else, goes to the cascade's `Synthesizer` pool and is due a fixed number of micro-turns later
(`Speaker.budget_ticks`), so a media-pace session (which waits for `pending_work`) and a real-time
one play it at the same micro-turn unless the machine is overloaded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from models.interaction.phrases import PhraseSet
from models.speech.speaker import Speaker, Synthesizer
from streaming.types import Audio

log = logging.getLogger(__name__)

VOICE = "piper:joe"  # the cascade's voice, and the one the training episodes give the assistant
FALLBACK_VOICE = "espeak:en-us"
BACKCHANNEL = "Mm-hm."
# Synthesis budget of a phrase (Speaker.budget_ticks): the cascade's defaults (CascadeOptions.tts_budget_ms,
# tts_ms_per_char), for the same voice on the same machines; a phrase plays no earlier than this after
# its text is known (pre-rendered phrases play at once).
BUDGET_MS = 60.0
MS_PER_CHAR = 6.0
FREE_WORDS = 3  # free text (no phrase set) is spoken every this many whole words, or at a clause mark
_CLAUSE_END = re.compile(rb"[,.;:!?]\s")


@dataclass
class TalkerSession:
    """One session's mouth."""

    speaker: Speaker  # the per-session queue of phrases, one micro-turn of audio per `play`
    written: bytearray = field(default_factory=bytearray)  # the current utterance as the model wrote it
    handed: int = 0  # bytes of `written` already given to the speaker (or covered by a committed phrase)
    committed: bool = False  # a phrase of the set was given to the speaker (the rest goes phrase by phrase)


class PiperTalker:
    """Shared by every session of a model: the voice, its synthesis thread and the rendered phrases."""

    def __init__(self, phrases: PhraseSet | None, voice: str = VOICE, fallback: str = FALLBACK_VOICE,
                 workers: int = 1) -> None:
        self.synth = _PhraseCache(voice, fallback, workers)
        fixed = (BACKCHANNEL, *phrases.replies, phrases.answer_lead) if phrases is not None else (BACKCHANNEL,)
        # Daemon: a server stopping mid-render must not wait for it (the cache is only a speed-up).
        self.prerendered = threading.Thread(target=self._prerender, args=(fixed,), name="talker-prerender",
                                            daemon=True)
        self.prerendered.start()

    def _prerender(self, phrases: tuple[str, ...]) -> None:
        t0 = time.monotonic()
        for p in phrases:  # one at a time: each is in the cache (Speaker.say reads it) as soon as it is done
            self.synth.prerender((p,))
        log.info("native talker: %s, %d phrases pre-rendered in %.1f s", self.synth.voice.name, len(phrases),
                 time.monotonic() - t0)

    def open(self) -> TalkerSession:
        return TalkerSession(Speaker(self.synth, BUDGET_MS, MS_PER_CHAR))

    def close(self, ts: TalkerSession) -> None:
        ts.speaker.drop()

    def shutdown(self) -> None:
        self.synth.close()

    def pending_work(self, ts: TalkerSession) -> list[Future[Audio]]:
        """The synthesis the session's next micro-turn plays, once due (`OffThreadWork`)."""
        return ts.speaker.waiting()

    def step(self, ts: TalkerSession, speak: bool, stop: bool, backchannel: bool, new: bytes,
             committed: str | None) -> Audio:
        """One micro-turn of the model's voice: float32[4800] at 24 kHz.

        `speak`: the model holds the floor this micro-turn and wrote `new` (bytes, maybe none);
        `stop`: it yielded or the client cancelled; `backchannel`: it chose to backchannel;
        `committed`: the whole utterance when the phrase set leaves only one way to finish it."""
        if stop:
            ts.speaker.drop()  # cut mid-phrase: this micro-turn is already silent
            self._end(ts)
        elif speak:
            ts.written += new
            if committed is not None:
                # The phrase set: `committed` is the utterance up to the end of the phrase now forced; what
                # is new of it (a first phrase, or one chained after those already given) is spoken whole.
                whole = committed.encode()
                if len(whole) > ts.handed:
                    self._say(ts, whole[ts.handed :])
                    ts.handed = len(whole)
                ts.committed = True
            elif not ts.committed:
                self._say(ts, _ready(bytes(ts.written[ts.handed :])))
        else:
            if not ts.committed:
                self._say(ts, bytes(ts.written[ts.handed :]))  # the model stopped writing: say the rest
            self._end(ts)
            if backchannel and not ts.speaker.queue:
                ts.speaker.say(BACKCHANNEL, "backchannel")
        return ts.speaker.play(grace=0.0).audio  # never wait here: late synthesis plays when ready

    def _say(self, ts: TalkerSession, chunk: bytes) -> None:
        if chunk.strip():
            ts.speaker.say(chunk.decode("utf-8", "replace").strip(), "say")
        if not ts.committed:
            ts.handed += len(chunk)

    @staticmethod
    def _end(ts: TalkerSession) -> None:
        ts.written.clear()
        ts.handed, ts.committed = 0, False


def phrase_cache_dir() -> Path:
    """Rendered phrases kept across starts, like llama-server's build ($XDG_CACHE_HOME or ~/.cache)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "duplex" / "talker"


class _PhraseCache(Synthesizer):
    """The cascade's synthesizer whose pre-rendered phrases are also kept on disk, per voice, text and
    noise setting (DUPLEX_TTS_DETERMINISTIC renders without Piper's sampling noise)."""

    def prerender(self, phrases: tuple[str, ...]) -> None:
        for text in phrases:
            quiet = os.environ.get("DUPLEX_TTS_DETERMINISTIC") == "1"
            key = hashlib.sha256(f"{self.voice.name}\0{quiet}\0{text}".encode()).hexdigest()[:24]
            path = phrase_cache_dir() / f"{key}.npy"
            try:
                audio = np.load(path)
            except (OSError, ValueError):  # not there yet, or a torn file: render it (again)
                audio = self.render(text)
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
                    np.save(tmp, audio)
                    tmp.replace(path)  # atomic: another server starting at once reads a whole file or none
                except OSError as e:  # a read-only home only costs the next start its rendering
                    log.warning("cannot keep rendered phrases in %s: %s", path.parent, e)
            self._cache[text] = audio


def _ready(pending: bytes) -> bytes:
    """The part of free text to speak now: up to its last clause mark, or its first `FREE_WORDS` whole
    words (a word is whole once a space follows it)."""
    marks = list(_CLAUSE_END.finditer(pending))
    if marks:
        return pending[: marks[-1].end()]
    words = pending.split(b" ")
    if len(words) > FREE_WORDS:  # the last item is a word still being written
        return b" ".join(words[:FREE_WORDS]) + b" "
    return b""
