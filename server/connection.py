"""What every protocol's client connection shares, whatever its events and its transport.

A connection is its session's `OutputSink` (server/sessions.py): the runtime binds it to a session
(`bind`), the engine hands it each micro-turn's output (`deliver`, the protocol's own mapping), and the
server's other events reach it through `emit`. Serialized events go to `outbox`, which the transport
(WebSocket writer, WebRTC data channel) drains; a client that stops reading is cut (`cut` is set) and
its session stays resumable. Client audio goes to the runtime resampled to 24 kHz (`push_audio`).
A transport with its own audio path (WebRTC) passes an `AudioOutput`; output audio then goes there.

A protocol subclasses `Connection` and writes its greeting (`hello`), its goodbye (`goodbye`), its
error event (`error_event`) and its output mapping (`deliver`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from enum import Enum
from typing import Any, Protocol

import numpy as np

from models.base import TickOutput
from server import protocol as p
from server.outbox import Close, Outbox
from server.protocol import ProtocolError
from server.runtime import Runtime
from server.sessions import Session
from streaming.pcm import PCMError, float32_to_pcm16, pcm16_to_float32
from streaming.resample import StreamResampler
from streaming.types import SAMPLE_RATE

log = logging.getLogger(__name__)


class ConnState(Enum):
    NEW = "new"  # not bound to a session yet
    OPEN = "open"  # greeted; client events accepted
    CLOSING = "closing"  # the server is ending the session; client events ignored


class AudioOutput(Protocol):
    """A transport's own output audio path (WebRTC's paced RTP track)."""

    def push(self, audio: np.ndarray) -> None:
        """One micro-turn of output, float32 at 24 kHz."""
        ...

    def clear(self) -> int:
        """Drop what is queued (barge-in, cancel); returns the milliseconds dropped."""
        ...


class Connection:
    def __init__(self, runtime: Runtime, audio_out: AudioOutput | None = None, media_ok: bool = True) -> None:
        self.runtime = runtime
        self.audio_out = audio_out  # None: output audio goes out as events
        self.media_ok = media_ok  # the transport can serve pace 'media'
        self._session: Session | None = None
        self.state = ConnState.NEW
        self.outbox = Outbox(runtime.config.max_outbox_bytes)
        self.cut = asyncio.Event()  # set when the client is cut for not reading: the transport hangs up now
        self._in_resampler: StreamResampler | None = None
        self._out_resampler: StreamResampler | None = None
        self._released = False  # the transport ended: no more audio in or out
        self.resumed = False

    @property
    def session(self) -> Session:
        assert self._session is not None, "connection not bound to a session yet"
        return self._session

    @property
    def session_id(self) -> str | None:
        """The session's id once bound; None before."""
        return self._session.id if self._session is not None else None

    # -- what a protocol writes ----------------------------------------------------------------

    def hello(self) -> None:
        """Greet the client once bound (its session, its resume token)."""
        raise NotImplementedError

    def goodbye(self, code: int, reason: str) -> dict[str, Any]:
        """The last event before the server hangs up."""
        raise NotImplementedError

    def error_event(self, exc: ProtocolError) -> dict[str, Any]:
        """The protocol's error event for a client's mistake."""
        raise NotImplementedError

    def deliver(self, out: TickOutput, tick: int) -> None:
        """One micro-turn's output, as the protocol's events."""
        raise NotImplementedError

    def outgoing(self, event: dict[str, Any]) -> dict[str, Any]:
        """An event on its way out (renamed, noted); the default sends it as it is."""
        return event

    # -- OutputSink ---------------------------------------------------------------------------

    def bind(self, session: Session, resumed: bool) -> None:
        """The runtime attached this connection to `session`: take its settings and greet the client."""
        self._session, self.resumed = session, resumed
        self.state = ConnState.OPEN
        self.apply_formats()
        self.hello()

    def emit(self, event: dict[str, Any]) -> None:
        if self.state is not ConnState.OPEN:
            return
        text = json.dumps(self.outgoing(event), separators=(",", ":"))
        if not self.outbox.fits(len(text)):
            # The client does not read: cut it (its session stays resumable). `end` never emits
            # through this path, so there is no recursion however full the outbox is. What is queued
            # is dropped so that the close frame and its reason are the next thing the client reads:
            # behind megabytes of events, a slow reader would be hung up on before it got there.
            queued = self.outbox.bytes
            dropped = self.outbox.clear() + 1
            self.runtime.metrics.dropped_events.labels("outbox_full").inc(dropped)
            log.warning("session %s: client not reading (%d bytes queued); disconnecting it", self.session.id,
                        queued)
            self._close(1008, f"not reading: {dropped} events ({queued} B) dropped; resume the session")
            self.cut.set()
            return
        self.outbox.put(text)

    def end(self, code: int, reason: str) -> None:
        if self.state is ConnState.OPEN:
            self.outbox.put(json.dumps(self.goodbye(code, reason)))  # past the bound on purpose: it is the last event
            self._close(code, reason)

    def _close(self, code: int, reason: str) -> None:
        self.state = ConnState.CLOSING
        self.outbox.put(Close(code, reason))

    def release(self) -> None:
        """The transport is done with this connection: drop its resamplers now. Each holds an FFmpeg
        filter graph with its own threads, and the connection sits in reference cycles (a protocol's
        handler table holds its bound methods), so without this they lived until a full garbage
        collection: the server's thread count grew by four per session that used another rate."""
        self._released = True
        self._in_resampler = self._out_resampler = None

    # -- audio ----------------------------------------------------------------------------------

    def apply_formats(self) -> None:
        """(Re)build the resamplers for the session's audio formats."""
        cfg = self.session.settings
        self._in_resampler = (StreamResampler(cfg.in_format.rate, SAMPLE_RATE)
                              if cfg.in_format.rate != SAMPLE_RATE else None)
        self._out_resampler = (StreamResampler(SAMPLE_RATE, cfg.out_format.rate)
                               if cfg.out_format.rate != SAMPLE_RATE else None)

    def encode_audio(self, audio: np.ndarray) -> str:
        """One micro-turn of output (24 kHz float32) in the session's output format, base64 PCM16."""
        if self._released:
            return ""
        if self._out_resampler is not None:
            audio = self._out_resampler.process(audio)
        return p.encode_audio_b64(float32_to_pcm16(audio))

    async def push_audio(self, audio: np.ndarray) -> None:
        """float32 audio in the session's input rate -> the runtime (24 kHz)."""
        if self._released:
            return
        if self._in_resampler is not None:
            audio = self._in_resampler.process(audio)
        await self.runtime.push_audio(self.session, audio)

    async def handle_audio_bytes(self, data: bytes, event_id: str | None = None) -> None:
        """Raw PCM16 in the session's input format (binary WebSocket frames take this path directly)."""
        if not self.admit(len(data), "audio frame", event_id):
            return
        try:
            audio = pcm16_to_float32(data)
        except PCMError as exc:
            self.error(ProtocolError("odd_pcm_length", str(exc), "audio", event_id))
            return
        await self.push_audio(audio)

    # -- client messages ------------------------------------------------------------------------

    def error(self, exc: ProtocolError) -> None:
        self.runtime.metrics.client_errors.labels(exc.code).inc()
        self.emit(self.error_event(exc))

    def admit(self, size: int, what: str, event_id: str | None = None) -> bool:
        """Common gate for client messages: open connection, activity stamp, size limit."""
        if self.state is not ConnState.OPEN:
            return False
        self.session.last_activity = time.monotonic()
        limit = self.runtime.config.max_frame_bytes
        if size > limit:
            self.error(ProtocolError("frame_too_large", f"{what} of {size} bytes is over the {limit}-byte limit; "
                                     "send audio in smaller chunks", None, event_id))
            return False
        return True
