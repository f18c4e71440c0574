"""One client connection speaking the Realtime event protocol, independent of its transport.

The WebSocket endpoint and the WebRTC data channel both feed client messages in (`handle_text`,
`handle_audio`) and drain server events from `outbox`. The connection is the session's
`OutputSink`: the engine hands it each micro-turn's output, which it turns into events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import Enum
from typing import Any

import numpy as np

from models.base import TickOutput
from server import protocol as p
from server.protocol import ProtocolError
from server.runtime import Runtime
from server.sessions import Pace, Session
from streaming.pcm import PCMError, float32_to_pcm16, pcm16_to_float32
from streaming.resample import StreamResampler
from streaming.types import SAMPLE_RATE, TICK_SECONDS

log = logging.getLogger(__name__)

OUTBOX_LIMIT = 2000  # events queued for a client that does not read; past this it is disconnected
OVERRUN_ERROR_INTERVAL = 1.0  # seconds between repeated input_overrun errors


# Server event names of the Realtime beta protocol, for clients that connect with `OpenAI-Beta: realtime=v1`.
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
}


class ConnState(Enum):
    OPEN = "open"  # session.created sent; client events accepted
    CLOSING = "closing"  # the server is ending the session; client events ignored
    CLOSED = "closed"


class Close:
    """Outbox sentinel: the transport should close with this code and reason."""

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


class RealtimeConnection:
    def __init__(self, runtime: Runtime, session: Session, resumed: bool = False, beta: bool = False) -> None:
        self.runtime = runtime
        self.beta = beta  # emit the beta protocol's event names
        self.session = session
        self.state = ConnState.OPEN
        self.outbox: asyncio.Queue[dict[str, Any] | Close] = asyncio.Queue()
        self.in_format = p.AudioFormat()
        self.out_format = p.AudioFormat()
        self._in_resampler: StreamResampler | None = None
        self._out_resampler: StreamResampler | None = None
        self.tick_stats = False  # send duplex.tick after every micro-turn (session.update duplex.tick_stats)
        self._response_id: str | None = None  # the assistant utterance in progress
        self._item_id: str | None = None
        self._transcript: list[str] = []
        self._user_item: str | None = None
        self._user_text: list[str] = []
        self._late_item: str | None = None  # closed by speech_stopped, final transcript pending (issue 11)
        self._suppress_before = 0  # outputs of ticks before this were cancelled by response.cancel
        self._last_overrun_error = 0.0
        self.resumed = resumed

    # -- session lifecycle events -------------------------------------------------------------

    def hello(self) -> None:
        s = self.session
        self.emit({"type": "session.created", "event_id": p.new_id("event"), "session": self.describe()})
        self.emit({"type": "duplex.session.resume", "event_id": p.new_id("event"), "session_id": s.id,
                   "resume_token": s.resume_token, "resumed": self.resumed, "tick": s.tick,
                   "grace_seconds": self.runtime.config.resume_grace})

    def describe(self) -> dict[str, Any]:
        s = self.session
        return {
            "id": s.id, "object": "realtime.session", "type": "realtime", "model": self.runtime.model.name,
            "instructions": s.instructions, "output_modalities": ["audio"], "tools": s.tools,
            "audio": {"input": {"format": self.in_format.describe(), "turn_detection": None},
                      "output": {"format": self.out_format.describe()}},
            "pace": s.pace.value, "duplex": {"tick_stats": self.tick_stats, "tick_ms": int(TICK_SECONDS * 1000)},
        }

    # -- OutputSink -------------------------------------------------------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        if self.state is not ConnState.OPEN and event.get("type") != "error":
            return
        if self.outbox.qsize() >= OUTBOX_LIMIT:
            self.end(1008, "client is not reading its events")
            return
        if self.beta and event["type"] in BETA_NAMES:
            event["type"] = BETA_NAMES[event["type"]]
        self.outbox.put_nowait(event)

    def end(self, code: int, reason: str) -> None:
        if self.state is ConnState.OPEN:
            self.emit({"type": "duplex.session.closing", "event_id": p.new_id("event"), "code": code,
                       "reason": reason})
            self.state = ConnState.CLOSING
            self.outbox.put_nowait(Close(code, reason))

    def deliver(self, out: TickOutput, tick: int) -> None:
        media = self.session.pace is Pace.MEDIA
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
        if self.tick_stats:
            self.emit({"type": "duplex.tick", "event_id": p.new_id("event"), "tick": tick,
                       "buffered_ms": int(self.session.chunker.buffered / SAMPLE_RATE * 1000),
                       "dropped_samples": self.session.chunker.dropped,
                       "late_ms": round(self.session.last_lateness * 1000, 1)})

    def send_audio(self, audio: np.ndarray, tick: int) -> None:
        """One micro-turn of output audio (24 kHz float32). WebRTC overrides this to feed its track."""
        self.emit({"type": "response.output_audio.delta", "event_id": p.new_id("event"),
                   "response_id": self._response_id, "item_id": self._item_id, "output_index": 0,
                   "content_index": 0, "delta": self._encode_out(audio), "tick": tick})

    def _encode_out(self, audio: np.ndarray) -> str:
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
            # Issue 11: a final transcript made after the end of turn (cascade + Whisper) completes
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
            self._late_item = None if self._user_text else item  # issue 11: its transcript may follow
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
        """float32 audio in the session's input rate -> engine (24 kHz)."""
        if self._in_resampler is not None:
            audio = self._in_resampler.process(audio)
        engine = self.runtime.engine
        assert engine is not None
        if self.session.pace is Pace.MEDIA:
            await engine.push_audio_media(self.session, audio)
            return
        if engine.push_audio(self.session, audio):
            now = time.monotonic()
            if now - self._last_overrun_error > OVERRUN_ERROR_INTERVAL:
                self._last_overrun_error = now
                self.error(ProtocolError("input_overrun", "audio is arriving faster than real time; the oldest "
                                         f"input was dropped ({self.session.chunker.dropped} samples so far). "
                                         "Send at real-time pace or use session.pace 'media'"))

    async def _dispatch(self, ev: dict[str, Any]) -> None:
        etype, eid = ev["type"], ev.get("event_id")
        s = self.session
        engine = self.runtime.engine
        assert engine is not None
        if etype == "session.update":
            self._session_update(ev.get("session"), eid)
        elif etype == "input_audio_buffer.append":
            await self.handle_audio_bytes(p.decode_audio_b64(ev.get("audio"), eid), eid)
        elif etype == "input_audio_buffer.commit":
            # Full duplex has no turns to commit: input is stepped every micro-turn anyway.
            self.emit({"type": "input_audio_buffer.committed", "event_id": p.new_id("event"),
                       "item_id": p.new_id("item"), "previous_item_id": None})
        elif etype == "input_audio_buffer.clear":
            s.chunker.clear()
            s.room.set()
            self.emit({"type": "input_audio_buffer.cleared", "event_id": p.new_id("event")})
        elif etype == "conversation.item.create":
            item = ev.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                self._background_event(ev, eid)
                return
            is_message = isinstance(item, dict) and item.get("type", "message") == "message"
            if is_message and isinstance(item, dict) and item.get("role", "user") != "user":
                raise ProtocolError("unsupported_item", "only user messages and function_call_output items can be "
                                    "created", "item.role", eid)
            text = p.item_text(item, eid)
            s.text_in.append(text)
            s.log.add(s.tick * TICK_SECONDS, "user", text, kind="typed")
            engine.nudge(s)
            item_id = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else p.new_id("item")
            self.emit({"type": "conversation.item.added", "event_id": p.new_id("event"), "previous_item_id": None,
                       "item": {"id": item_id, "type": "message", "role": "user",
                                "content": [{"type": "input_text", "text": text}]}})
        elif etype == "response.create":
            # The model decides when to speak every micro-turn; a client request is only a hint.
            engine.nudge(s)
        elif etype == "response.cancel":
            if self._response_id is None:
                raise ProtocolError("response_cancel_not_active", "there is no active response to cancel",
                                    None, eid)
            s.cancel = True
            self._suppress_before = s.tick  # ticks already in flight are silenced
            engine.nudge(s)
            self._finish_response("cancelled")
        elif etype == "output_audio_buffer.clear":
            self._suppress_before = s.tick
        elif etype.startswith(p.EXT + "background."):
            self._background_event(ev, eid)

    def _background_event(self, ev: dict[str, Any], eid: str | None) -> None:
        handler = getattr(self.session.background, "on_client_event", None)
        if handler is None or not handler(ev):
            raise ProtocolError("background_unavailable", "this server runs no background reasoner "
                                "(start it with --background)", "type", eid)

    def _session_update(self, cfg: Any, eid: str | None) -> None:
        s = self.session
        if not isinstance(cfg, dict):
            raise ProtocolError("invalid_session", "'session' must be an object", "session", eid)
        # Validate everything first so that a bad field changes nothing.
        pace = s.pace
        if "pace" in cfg:
            try:
                pace = Pace(cfg["pace"])
            except ValueError:
                raise ProtocolError("invalid_pace", f"session.pace must be 'realtime' or 'media', got {cfg['pace']!r}",
                                    "session.pace", eid) from None
            if pace is not s.pace and s.audio_started:
                raise ProtocolError("pace_locked", "session.pace can only change before the first audio is sent",
                                    "session.pace", eid)
        audio: dict[str, Any] = cfg["audio"] if isinstance(cfg.get("audio"), dict) else {}
        in_fmt, out_fmt = self.in_format, self.out_format
        if "input_audio_format" in cfg:
            in_fmt = p.parse_format(cfg["input_audio_format"], "session.input_audio_format", eid)
        if isinstance(audio.get("input"), dict) and "format" in audio["input"]:
            in_fmt = p.parse_format(audio["input"]["format"], "session.audio.input.format", eid)
        if "output_audio_format" in cfg:
            out_fmt = p.parse_format(cfg["output_audio_format"], "session.output_audio_format", eid)
        if isinstance(audio.get("output"), dict) and "format" in audio["output"]:
            out_fmt = p.parse_format(audio["output"]["format"], "session.audio.output.format", eid)
        if in_fmt.rate != self.in_format.rate and s.audio_started:
            raise ProtocolError("format_locked", "the input format can only change before the first audio",
                                "session.audio.input.format", eid)
        if "instructions" in cfg and not isinstance(cfg["instructions"], str):
            raise ProtocolError("invalid_instructions", "session.instructions must be a string",
                                "session.instructions", eid)
        tools = cfg.get("tools", s.tools)
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                  for t in tools):
            raise ProtocolError("invalid_tools", "session.tools must be a list of {type: 'function', name, "
                                "description, parameters}", "session.tools", eid)
        ext = cfg.get("duplex", {})
        if not isinstance(ext, dict):
            raise ProtocolError("invalid_session", "session.duplex must be an object", "session.duplex", eid)
        # Apply.
        if pace is not s.pace:
            s.pace = pace
            assert self.runtime.engine is not None
            self.runtime.engine.add(s)
        self.in_format, self.out_format = in_fmt, out_fmt
        self._in_resampler = StreamResampler(in_fmt.rate, SAMPLE_RATE) if in_fmt.rate != SAMPLE_RATE else None
        self._out_resampler = StreamResampler(SAMPLE_RATE, out_fmt.rate) if out_fmt.rate != SAMPLE_RATE else None
        s.instructions = cfg.get("instructions", s.instructions)
        s.tools = tools
        if "tick_stats" in ext:
            self.tick_stats = bool(ext["tick_stats"])
        self.emit({"type": "session.updated", "event_id": p.new_id("event"), "session": self.describe()})
