"""The Realtime protocol's output mapping: each micro-turn's `TickOutput` as Realtime server events.

Full duplex has no turns, so responses are made up from the output: the first audible (or worded)
micro-turn opens a response, the first silent one without words closes it (`response.done`). The user's
words come as input transcription events between the model's `speech_started` and `speech_stopped`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from models.base import TickOutput
from server import protocol as p
from server.connection import Connection
from server.sessions import Pace
from streaming.types import SAMPLE_RATE, TICK_SECONDS


class RealtimeOutput:
    """One connection's response and transcript state; events leave through the connection's `emit`."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.emit = conn.emit
        self.response_id: str | None = None  # the assistant utterance in progress
        self._item_id: str | None = None
        self._transcript: list[str] = []
        self._user_item: str | None = None
        self._user_text: list[str] = []
        self._late_item: str | None = None  # closed by speech_stopped, final transcript pending
        self._suppress_before = 0  # outputs of ticks before this were cancelled by response.cancel

    def silence_before(self, tick: int) -> None:
        """Outputs of micro-turns before `tick` (already in flight) are not heard (a cancel, a clear)."""
        self._suppress_before = tick

    def deliver(self, out: TickOutput, tick: int) -> None:
        conn = self.conn
        if conn.audio_out is not None and any(ev.type == "yielded" for ev in out.events):
            conn.audio_out.clear()  # the model gave up the floor (barge-in): queued speech must not play on
        s = conn.session
        media = s.settings.pace is Pace.MEDIA
        audio = out.audio
        if tick < self._suppress_before:
            audio = np.zeros_like(audio)  # cancelled: this tick was already in flight
        speaking = bool(np.any(audio))
        if (speaking or (out.text and tick >= self._suppress_before)) and self.response_id is None:
            self._start_response()
        if speaking or media:
            self.send_audio(audio, tick)
        if out.text and tick >= self._suppress_before:
            self._transcript.append(out.text)
            self.emit({"type": "response.output_audio_transcript.delta", "event_id": p.new_id("event"),
                       "response_id": self.response_id, "item_id": self._item_id, "output_index": 0,
                       "content_index": 0, "delta": out.text, "tick": tick})
        if out.user_text:
            self._user_transcript(out.user_text, tick)
        for ev in out.events:
            self._model_event(ev.type, ev.data, tick)
        if not speaking and self.response_id is not None and not out.text:
            self.finish_response("completed")
        if s.settings.tick_stats:
            self.emit({"type": "duplex.tick", "event_id": p.new_id("event"), "tick": tick,
                       "buffered_ms": int(s.buffered_samples / SAMPLE_RATE * 1000),
                       "dropped_samples": s.dropped_samples, "late_ms": round(s.last_lateness * 1000, 1),
                       "heard_samples": s.heard_through})

    def send_audio(self, audio: np.ndarray, tick: int) -> None:
        """One micro-turn of output audio (24 kHz float32): to the transport's audio path, or as an event."""
        if self.conn.audio_out is not None:
            self.conn.audio_out.push(audio)
            return
        self.emit({"type": "response.output_audio.delta", "event_id": p.new_id("event"),
                   "response_id": self.response_id, "item_id": self._item_id, "output_index": 0,
                   "content_index": 0, "delta": self.conn.encode_audio(audio), "tick": tick})

    def _start_response(self) -> None:
        self.response_id, self._item_id, self._transcript = p.new_id("resp"), p.new_id("item"), []
        self.emit({"type": "response.created", "event_id": p.new_id("event"),
                   "response": {"id": self.response_id, "object": "realtime.response", "status": "in_progress",
                                "output": []}})

    def finish_response(self, status: str) -> None:
        rid, iid, text = self.response_id, self._item_id, "".join(self._transcript)
        self.response_id = self._item_id = None
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
            self.conn.runtime.metrics.client_errors.labels("model_error").inc()
            self.emit(p.error_event("model_error", str(data.get("message", "model error")), kind="server_error"))
        else:
            self.emit({"type": "duplex.event", "event_id": p.new_id("event"), "event": etype, "data": data,
                       "tick": tick})
