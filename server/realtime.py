"""One client connection speaking the Realtime event protocol, independent of its transport.

The WebSocket endpoint and the WebRTC data channel both feed client messages in (`handle_text`,
`handle_audio_bytes`) and drain serialized server events from `outbox`. What a client sends goes to
the runtime (`Runtime.push_audio`, `push_text`, `cancel`, `settings_changed`...), never to the engine
or the session's inbox. The connection is the session's `OutputSink`: the runtime binds it to a
session (`bind`), and the engine hands it each micro-turn's output, which it turns into events. A
transport with its own audio path (WebRTC) passes an `AudioOutput`; output audio then goes there
instead of into events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any, Protocol

import numpy as np

from models.base import TickOutput
from server import protocol as p
from server._session_update import updated_settings
from server.items import MAX_ITEMS
from server.limits import (
    IMAGE_ITEM_BURST,
    MAX_IMAGES_PER_ITEM,
    MAX_ITEM_TEXT_CHARS,
    VIDEO_FRAME_BURST,
    VIDEO_FRAMES_PER_S,
)
from server.outbox import Close, Outbox
from server.pictures import FrameRate, picture
from server.protocol import ProtocolError
from server.runtime import Runtime
from server.sessions import Pace, Session, TextFull
from streaming.pcm import PCMError, float32_to_pcm16, pcm16_to_float32
from streaming.resample import StreamResampler
from streaming.types import SAMPLE_RATE, TICK_SECONDS

log = logging.getLogger(__name__)


# Server event names of the Realtime beta protocol, for clients that connect with `OpenAI-Beta: realtime=v1`.
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
}


class ConnState(Enum):
    NEW = "new"  # not bound to a session yet
    OPEN = "open"  # session.created sent; client events accepted
    CLOSING = "closing"  # the server is ending the session; client events ignored


class AudioOutput(Protocol):
    """A transport's own output audio path (WebRTC's paced RTP track)."""

    def push(self, audio: np.ndarray) -> None:
        """One micro-turn of output, float32 at 24 kHz."""
        ...

    def clear(self) -> int:
        """Drop what is queued (barge-in, cancel); returns the milliseconds dropped."""
        ...


Handler = Callable[[dict[str, Any], str | None], Awaitable[None] | None]


class RealtimeConnection:
    def __init__(self, runtime: Runtime, beta: bool = False, audio_out: AudioOutput | None = None,
                 media_ok: bool = True) -> None:
        self.runtime = runtime
        self.beta = beta  # emit the beta protocol's event names
        self.audio_out = audio_out  # None: output audio goes out as response.output_audio.delta events
        self.media_ok = media_ok  # the transport can serve pace 'media'
        self._session: Session | None = None
        self.state = ConnState.NEW
        self.outbox = Outbox(runtime.config.max_outbox_bytes)
        self.cut = asyncio.Event()  # set when the client is cut for not reading: the transport hangs up now
        self._in_resampler: StreamResampler | None = None
        self._out_resampler: StreamResampler | None = None
        self._released = False  # the transport ended: no more audio in or out
        self._response_id: str | None = None  # the assistant utterance in progress
        self._item_id: str | None = None
        self._transcript: list[str] = []
        self._user_item: str | None = None
        self._user_text: list[str] = []
        self._late_item: str | None = None  # closed by speech_stopped, final transcript pending
        self._suppress_before = 0  # outputs of ticks before this were cancelled by response.cancel
        self.resumed = False
        # One table for every client event, whatever the transport.
        self._handlers: dict[str, Handler] = {
            "session.update": self._on_session_update,
            "input_audio_buffer.append": self._on_append,
            "input_audio_buffer.commit": self._on_commit,
            "input_audio_buffer.clear": self._on_clear,
            "conversation.item.create": self._on_item_create,
            "conversation.item.retrieve": self._on_item_retrieve,
            "response.create": self._on_response_create,
            "response.cancel": self._on_response_cancel,
            "output_audio_buffer.clear": self._on_output_clear,
            "duplex.background.request": self._background_event,
            "duplex.input_video.append": self._on_video_append,
        }
        self._frame_rate = FrameRate(VIDEO_FRAMES_PER_S, VIDEO_FRAME_BURST)  # duplex.input_video.append
        self._image_rate = FrameRate(VIDEO_FRAMES_PER_S, IMAGE_ITEM_BURST)  # input_image parts

    @property
    def session(self) -> Session:
        assert self._session is not None, "connection not bound to a session yet"
        return self._session

    def bind(self, session: Session, resumed: bool) -> None:
        """The runtime attached this connection to `session`: take its settings and greet the client."""
        self._session, self.resumed = session, resumed
        self.state = ConnState.OPEN
        self._apply_formats()
        self.hello()

    def release(self) -> None:
        """The transport is done with this connection: drop its resamplers now. Each holds an FFmpeg
        filter graph with its own threads, and the connection sits in reference cycles (its handler
        table holds its bound methods), so without this they lived until a full garbage collection:
        the server's thread count grew by four per session that used another rate (found by bench.soak)."""
        self._released = True
        self._in_resampler = self._out_resampler = None

    def _apply_formats(self) -> None:
        cfg = self.session.settings
        self._in_resampler = (StreamResampler(cfg.in_format.rate, SAMPLE_RATE)
                              if cfg.in_format.rate != SAMPLE_RATE else None)
        self._out_resampler = (StreamResampler(SAMPLE_RATE, cfg.out_format.rate)
                               if cfg.out_format.rate != SAMPLE_RATE else None)

    # -- session lifecycle events -------------------------------------------------------------

    def hello(self) -> None:
        s = self.session
        self.emit({"type": "session.created", "event_id": p.new_id("event"), "session": self.describe()})
        self.emit({"type": "duplex.session.resume", "event_id": p.new_id("event"), "session_id": s.id,
                   "resume_token": s.resume_token, "resumed": self.resumed, "tick": s.tick,
                   "grace_seconds": self.runtime.config.resume_grace})

    def describe(self) -> dict[str, Any]:
        s = self.session
        cfg = s.settings
        return {
            "id": s.id, "object": "realtime.session", "type": "realtime", "model": self.runtime.model.name,
            "instructions": cfg.instructions, "output_modalities": ["audio"], "tools": cfg.tools,
            "audio": {"input": {"format": cfg.in_format.describe(), "turn_detection": None},
                      "output": {"format": cfg.out_format.describe()}},
            "pace": cfg.pace.value, "duplex": {"tick_stats": cfg.tick_stats, "tick_ms": int(TICK_SECONDS * 1000),
                                                  "media_clock": cfg.media_clock},
        }

    # -- OutputSink -------------------------------------------------------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        if self.state is not ConnState.OPEN:
            return
        self.session.items.seen(event)  # every item the client is told of can be retrieved later
        if self.beta and event["type"] in BETA_NAMES:
            event["type"] = BETA_NAMES[event["type"]]
        text = json.dumps(event, separators=(",", ":"))
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
            goodbye = {"type": "duplex.session.closing", "event_id": p.new_id("event"), "code": code, "reason": reason}
            self.outbox.put(json.dumps(goodbye))  # past the bound on purpose: it is the last event
            self._close(code, reason)

    def _close(self, code: int, reason: str) -> None:
        self.state = ConnState.CLOSING
        self.outbox.put(Close(code, reason))

    def deliver(self, out: TickOutput, tick: int) -> None:
        if self.state is not ConnState.OPEN:
            return
        if self.audio_out is not None and any(ev.type == "yielded" for ev in out.events):
            self.audio_out.clear()  # the model gave up the floor (barge-in): queued speech must not play on
        s = self.session
        media = s.settings.pace is Pace.MEDIA
        audio = out.audio
        if tick < self._suppress_before:
            audio = np.zeros_like(audio)  # cancelled: this tick was already in flight
        speaking = bool(np.any(audio))
        if (speaking or (out.text and tick >= self._suppress_before)) and self._response_id is None:
            self._start_response()
        if speaking or media:
            self.send_audio(audio, tick)
        if out.text and tick >= self._suppress_before:
            self._transcript.append(out.text)
            self.emit({"type": "response.output_audio_transcript.delta", "event_id": p.new_id("event"),
                       "response_id": self._response_id, "item_id": self._item_id, "output_index": 0,
                       "content_index": 0, "delta": out.text, "tick": tick})
        if out.user_text:
            self._user_transcript(out.user_text, tick)
        for ev in out.events:
            self._model_event(ev.type, ev.data, tick)
        if not speaking and self._response_id is not None and not out.text:
            self._finish_response("completed")
        if s.settings.tick_stats:
            self.emit({"type": "duplex.tick", "event_id": p.new_id("event"), "tick": tick,
                       "buffered_ms": int(s.buffered_samples / SAMPLE_RATE * 1000),
                       "dropped_samples": s.dropped_samples, "late_ms": round(s.last_lateness * 1000, 1),
                       "heard_samples": s.heard_through})

    def send_audio(self, audio: np.ndarray, tick: int) -> None:
        """One micro-turn of output audio (24 kHz float32): to the transport's audio path, or as an event."""
        if self.audio_out is not None:
            self.audio_out.push(audio)
            return
        self.emit({"type": "response.output_audio.delta", "event_id": p.new_id("event"),
                   "response_id": self._response_id, "item_id": self._item_id, "output_index": 0,
                   "content_index": 0, "delta": self._encode_out(audio), "tick": tick})

    def _encode_out(self, audio: np.ndarray) -> str:
        if self._released:
            return ""
        if self._out_resampler is not None:
            audio = self._out_resampler.process(audio)
        return p.encode_audio_b64(float32_to_pcm16(audio))

    def _start_response(self) -> None:
        self._response_id, self._item_id, self._transcript = p.new_id("resp"), p.new_id("item"), []
        self.emit({"type": "response.created", "event_id": p.new_id("event"),
                   "response": {"id": self._response_id, "object": "realtime.response", "status": "in_progress",
                                "output": []}})

    def _finish_response(self, status: str) -> None:
        rid, iid, text = self._response_id, self._item_id, "".join(self._transcript)
        self._response_id = self._item_id = None
        self.emit({"type": "response.output_audio_transcript.done", "event_id": p.new_id("event"),
                   "response_id": rid, "item_id": iid, "output_index": 0, "content_index": 0, "transcript": text})
        self.emit({"type": "response.output_audio.done", "event_id": p.new_id("event"), "response_id": rid,
                   "item_id": iid, "output_index": 0, "content_index": 0})
        self.emit({"type": "response.done", "event_id": p.new_id("event"),
                   "response": {"id": rid, "object": "realtime.response", "status": status,
                                "output": [{"id": iid, "type": "message", "role": "assistant",
                                            "content": [{"type": "output_audio", "transcript": text}]}]}})

    def _user_transcript(self, text: str, tick: int) -> None:
        late, self._late_item = self._late_item, None
        if late is not None and self._user_item is None:
            # A final transcript made after the end of turn (cascade + Whisper) completes
            # the item that speech_stopped closed, as Realtime's asynchronous transcription does.
            self.emit({"type": "conversation.item.input_audio_transcription.completed",
                       "event_id": p.new_id("event"), "item_id": late, "content_index": 0, "transcript": text})
            return
        if self._user_item is None:
            self._user_item = p.new_id("item")
        self._user_text.append(text)
        self.emit({"type": "conversation.item.input_audio_transcription.delta", "event_id": p.new_id("event"),
                   "item_id": self._user_item, "content_index": 0, "delta": text, "tick": tick})

    def _model_event(self, etype: str, data: dict[str, Any], tick: int) -> None:
        ms = int(tick * TICK_SECONDS * 1000)
        if etype == "speech_started":
            self._user_item = self._user_item or p.new_id("item")
            self.emit({"type": "input_audio_buffer.speech_started", "event_id": p.new_id("event"),
                       "audio_start_ms": ms, "item_id": self._user_item})
        elif etype == "speech_stopped":
            item = self._user_item or p.new_id("item")
            self.emit({"type": "input_audio_buffer.speech_stopped", "event_id": p.new_id("event"),
                       "audio_end_ms": ms + int(TICK_SECONDS * 1000), "item_id": item})
            if self._user_text:
                self.emit({"type": "conversation.item.input_audio_transcription.completed",
                           "event_id": p.new_id("event"), "item_id": item, "content_index": 0,
                           "transcript": " ".join(self._user_text)})
            self._late_item = None if self._user_text else item  # its transcript may follow
            self._user_item, self._user_text = None, []
        elif etype == "error":
            self.runtime.metrics.client_errors.labels("model_error").inc()
            self.emit(p.error_event("model_error", str(data.get("message", "model error")), kind="server_error"))
        else:
            self.emit({"type": "duplex.event", "event_id": p.new_id("event"), "event": etype, "data": data,
                       "tick": tick})

    # -- client messages ----------------------------------------------------------------------

    def error(self, exc: ProtocolError) -> None:
        self.runtime.metrics.client_errors.labels(exc.code).inc()
        self.emit(p.error_event(exc.code, exc.message, exc.param, exc.event_id))

    def _admit(self, size: int, what: str, event_id: str | None = None) -> bool:
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

    async def handle_text(self, text: str) -> None:
        if not self._admit(len(text), "message"):
            return
        try:
            await self._dispatch(p.parse_client_text(text))
        except ProtocolError as exc:
            self.error(exc)

    async def handle_audio_bytes(self, data: bytes, event_id: str | None = None) -> None:
        """Raw PCM16 in the session's input format (binary WebSocket frames take this path directly)."""
        if not self._admit(len(data), "audio frame", event_id):
            return
        try:
            audio = pcm16_to_float32(data)
        except PCMError as exc:
            self.error(ProtocolError("odd_pcm_length", str(exc), "audio", event_id))
            return
        await self.push_audio(audio)

    async def push_audio(self, audio: np.ndarray) -> None:
        """float32 audio in the session's input rate -> the runtime (24 kHz)."""
        if self._released:
            return
        if self._in_resampler is not None:
            audio = self._in_resampler.process(audio)
        await self.runtime.push_audio(self.session, audio)

    async def _dispatch(self, ev: dict[str, Any]) -> None:
        handler = self._handlers.get(ev["type"])
        if handler is None:  # parse_client_text only lets known types through; a table gap is our bug
            raise ProtocolError("unknown_event_type", f"event type {ev['type']!r} is not handled here", "type",
                                ev.get("event_id"))
        result = handler(ev, ev.get("event_id"))
        if result is not None:
            await result

    def _on_session_update(self, ev: dict[str, Any], eid: str | None) -> None:
        s = self.session
        self.runtime.settings_changed(s, updated_settings(ev.get("session"), s.settings, s.audio_started,
                                                          self.media_ok, eid))
        self._apply_formats()
        self.emit({"type": "session.updated", "event_id": p.new_id("event"), "session": self.describe()})

    async def _on_append(self, ev: dict[str, Any], eid: str | None) -> None:
        await self.handle_audio_bytes(p.decode_audio_b64(ev.get("audio"), eid), eid)

    def _on_commit(self, ev: dict[str, Any], eid: str | None) -> None:
        # Full duplex has no turns to commit: input is stepped every micro-turn anyway.
        self.emit({"type": "input_audio_buffer.committed", "event_id": p.new_id("event"),
                   "item_id": p.new_id("item"), "previous_item_id": None})

    def _on_clear(self, ev: dict[str, Any], eid: str | None) -> None:
        self.runtime.clear_input(self.session)
        self.emit({"type": "input_audio_buffer.cleared", "event_id": p.new_id("event")})

    async def _on_item_create(self, ev: dict[str, Any], eid: str | None) -> None:
        s = self.session
        item = ev.get("item")
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            self._background_event(ev, eid)
            return
        if isinstance(item, dict) and item.get("type", "message") != "message":
            # function_call, image, ...: taken as typed text before (found by bench.fuzz)
            raise ProtocolError("unsupported_item", f"item type {str(item.get('type'))[:40]!r} cannot be created; "
                                "only user messages and function_call_output items can", "item.type", eid)
        if isinstance(item, dict) and item.get("role", "user") != "user":
            raise ProtocolError("unsupported_item", "only user messages and function_call_output items can be "
                                "created", "item.role", eid)
        text, images = p.item_parts(item, eid)
        if len(text) > MAX_ITEM_TEXT_CHARS:
            raise ProtocolError("item_too_large", f"the message has {len(text)} characters; the limit is "
                                f"{MAX_ITEM_TEXT_CHARS}", "item.content", eid)
        if len(images) > MAX_IMAGES_PER_ITEM:
            raise ProtocolError("too_many_images", f"the message has {len(images)} input_image parts; the limit is "
                                f"{MAX_IMAGES_PER_ITEM} (send pictures in separate items)", "item.content", eid)
        if images and not all(self._image_rate.take(time.monotonic()) for _ in images):
            self.runtime.metrics.dropped_events.labels("video_rate").inc()
            raise ProtocolError("video_rate_exceeded", f"pictures are arriving faster than {VIDEO_FRAMES_PER_S:g} a "
                                "second; this item was dropped", "item.content", eid)
        # Every picture is decoded before anything is pushed: a bad one changes nothing.
        frames = [await picture(data, "item.content", eid) for _, data in images]
        if self.state is not ConnState.OPEN:  # closed while decoding
            return
        for frame in frames:
            self.runtime.push_video(s, frame)
        said = bool(text) or not frames  # a message of empty text parts is still a (typed) message
        if said:
            try:
                self.runtime.push_text(s, text)
            except TextFull as exc:
                self.runtime.metrics.dropped_events.labels("inbox_full").inc()
                raise ProtocolError("text_buffer_full", str(exc), "item.content", eid) from None
        content: list[dict[str, Any]] = [{"type": "input_image", "width": int(f.shape[1]), "height": int(f.shape[0])}
                                         for f in frames]
        if said:
            content.append({"type": "input_text", "text": text})
        given = item.get("id") if isinstance(item, dict) else None
        item_id = given[:64] if isinstance(given, str) else p.new_id("item")
        self.emit({"type": "conversation.item.added", "event_id": p.new_id("event"), "previous_item_id": None,
                   "item": {"id": item_id, "type": "message", "role": "user", "content": content}})

    def _on_item_retrieve(self, ev: dict[str, Any], eid: str | None) -> None:
        item_id = ev.get("item_id")
        if not isinstance(item_id, str) or not item_id:
            raise ProtocolError("invalid_item_id", "conversation.item.retrieve needs a string 'item_id'", "item_id",
                                eid)
        item = self.session.items.get(item_id)
        if item is None:
            raise ProtocolError("item_not_found", f"no conversation item {item_id[:64]!r} in this session (unknown, "
                                f"or older than the last {MAX_ITEMS} items kept)", "item_id", eid)
        self.emit({"type": "conversation.item.retrieved", "event_id": p.new_id("event"), "item": item})

    async def _on_video_append(self, ev: dict[str, Any], eid: str | None) -> None:
        """One frame of a WebSocket camera: `image` is a base64 JPEG (or PNG), at most VIDEO_FRAMES_PER_S."""
        data = p.decode_b64(ev.get("image"), "image", eid)
        if not self._frame_rate.take(time.monotonic()):
            self.runtime.metrics.dropped_events.labels("video_rate").inc()
            raise ProtocolError("video_rate_exceeded", f"camera frames are arriving faster than "
                                f"{VIDEO_FRAMES_PER_S:g} a second; this one was dropped", "image", eid)
        frame = await picture(data, "image", eid)
        if self.state is ConnState.OPEN:
            self.runtime.push_video(self.session, frame)

    def _on_response_create(self, ev: dict[str, Any], eid: str | None) -> None:
        # The model decides when to speak every micro-turn; a client request is only a hint.
        self.runtime.respond(self.session)

    def _on_response_cancel(self, ev: dict[str, Any], eid: str | None) -> None:
        s = self.session
        if self.audio_out is not None:
            self.audio_out.clear()  # what is queued for the speaker stops now
        if self._response_id is None:
            raise ProtocolError("response_cancel_not_active", "there is no active response to cancel", None, eid)
        self._suppress_before = s.tick  # ticks already in flight are silenced
        self.runtime.cancel(s)
        self._finish_response("cancelled")

    def _on_output_clear(self, ev: dict[str, Any], eid: str | None) -> None:
        self._suppress_before = self.session.tick
        if self.audio_out is not None:
            dropped_ms = self.audio_out.clear()
            self.emit({"type": "output_audio_buffer.cleared", "event_id": p.new_id("event"),
                       "dropped_ms": dropped_ms})

    def _background_event(self, ev: dict[str, Any], eid: str | None) -> None:
        if not self.runtime.client_event(self.session, ev):
            raise ProtocolError("background_unavailable", "this server runs no background reasoner "
                                "(start it with --background)", "type", eid)
