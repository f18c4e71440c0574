"""A session's client input waiting for the next micro-turn, and the rules that bound it.

The runtime puts what a client sends in (`push`, `add_text`, `video`, `request_cancel`, `clear`); the
engine asks what is due (`ready`, `starved`, `steppable`, `fits`) and takes one micro-turn of it
(`take`). Every part is bounded: audio by its backlog (past it the oldest samples are dropped and
counted: an overrun), typed text by MAX_PENDING_TEXT_CHARS, video to the newest frame.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from models.base import BackgroundChunk, TickInput
from server.limits import MAX_PENDING_TEXT_CHARS
from streaming.chunker import Chunker
from streaming.types import Audio


class TextFull(Exception):
    """Typed text waiting for the next micro-turn is over its bound."""


class Pushed(NamedTuple):
    dropped: int  # old samples dropped because the client ran ahead (an overrun)
    completed: bool  # a whole micro-turn of input completed with this push


class Inbox:
    def __init__(self, max_backlog_ticks: int = 10) -> None:
        self._audio = Chunker(max_backlog_ticks=max_backlog_ticks)
        self._text: list[str] = []
        self._text_chars = 0  # at most MAX_PENDING_TEXT_CHARS
        self.video: npt.NDArray[np.uint8] | None = None  # newest frame since the last micro-turn (replaced)
        self._cancel = False  # response.cancel waiting for the next micro-turn
        self.audio_started = False  # any audio received yet (pace and input format are fixed after that)
        self.heard = 0  # samples of real input taken by micro-turns so far (padding of underruns excluded)
        self._overrun_told_at = 0.0  # monotonic time the client was last told its input overran
        self._room = asyncio.Event()  # media pace: the audio backlog has room
        self._room.set()

    # -- in ---------------------------------------------------------------------------------------

    def push(self, audio: Audio) -> Pushed:
        """Queue audio; past the backlog's bound the oldest samples go."""
        self.audio_started = True
        before = self._audio.ready()
        dropped = self._audio.push(audio)
        return Pushed(dropped, self._audio.ready() > before)

    def add_text(self, text: str) -> None:
        """Typed text for the next micro-turn; raises TextFull past its bound."""
        if self._text_chars + len(text) > MAX_PENDING_TEXT_CHARS:
            raise TextFull(f"{self._text_chars} characters of typed text are already waiting for the next "
                           f"micro-turn (limit {MAX_PENDING_TEXT_CHARS}); send less text at once")
        self._text.append(text)
        self._text_chars += len(text)

    def request_cancel(self) -> None:
        self._cancel = True

    def clear(self) -> int:
        """Drop the audio waiting for the coming micro-turns; returns the samples dropped."""
        dropped = self._audio.clear()
        self._room.set()
        return dropped

    def overrun_due(self, now: float, every: float) -> bool:
        """Whether an overrun should be told to the client now: at most once every `every` seconds."""
        if now - self._overrun_told_at <= every:
            return False
        self._overrun_told_at = now
        return True

    # -- what is due --------------------------------------------------------------------------------

    def ready(self) -> int:
        """Whole micro-turns of audio waiting."""
        return self._audio.ready()

    def starved(self) -> bool:
        """Audio has started but not a whole micro-turn of it is waiting (its next chunk is late)."""
        return self.audio_started and self._audio.ready() == 0

    def pending(self) -> bool:
        """Anything besides audio waiting (media pace steps for it even without a micro-turn of audio)."""
        return bool(self._text) or self._cancel

    def steppable(self) -> bool:
        """Media pace: a micro-turn of audio, or something else, is waiting."""
        return self._audio.ready() >= 1 or self.pending()

    def fits(self, samples: int) -> bool:
        """Whether `samples` more audio fit the backlog without dropping any."""
        return self._audio.buffered + samples <= self._audio.max_samples

    async def wait_room(self) -> None:
        """Media pace: wait until a micro-turn is taken (or the audio cleared)."""
        self._room.clear()
        await self._room.wait()

    # -- out --------------------------------------------------------------------------------------

    def take(self, background: list[BackgroundChunk]) -> TickInput:
        """One micro-turn of input (silence-padded when short), with whatever else is waiting."""
        chunk = self._audio.pop()
        self._room.set()
        self.heard += chunk.received
        text, self._text, self._text_chars = self._text, [], 0
        tick = TickInput(audio=chunk.audio, received=chunk.received, video=self.video, text=text,
                         background=background, cancel=self._cancel)
        self.video, self._cancel = None, False
        return tick

    # -- stats ------------------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Input samples waiting for the coming micro-turns."""
        return self._audio.buffered

    @property
    def dropped(self) -> int:
        """Input samples dropped because the client ran ahead of real time, in all."""
        return self._audio.dropped
