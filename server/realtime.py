"""One client connection speaking the Realtime event protocol: its client events, independent of transport.

The WebSocket endpoint and the WebRTC data channel both feed client messages in (`handle_text`,
`handle_audio_bytes`) and drain serialized server events from `outbox` (server/connection.py, the
plumbing every protocol shares). Each client event is parsed and dispatched to a runtime verb
(`Runtime.push_audio`, `push_text`, `cancel`, `settings_changed`...), never to the engine or the
session's inbox. Micro-turn outputs become Realtime events in server/realtime_output.py.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from models.base import TickOutput
from server import client_secrets, response_config
from server import lifecycle as lc
from server import protocol as p
from server._session_update import updated_settings
from server.connection import AudioOutput, Connection, ConnState
from server.extensions import plain
from server.inbox import TextFull
from server.items import END, MAX_ID_CHARS, MAX_ITEMS
from server.limits import (
    IMAGE_ITEM_BURST,
    MAX_IMAGES_PER_ITEM,
    MAX_ITEM_TEXT_CHARS,
    VIDEO_FRAME_BURST,
    VIDEO_FRAMES_PER_S,
)
from server.pictures import FrameRate, picture
from server.protocol import ProtocolError
from server.realtime_output import RealtimeOutput
from server.runtime import Runtime
from streaming.types import TICK_SECONDS

# Server event names of the Realtime beta protocol, for clients that connect with `OpenAI-Beta: realtime=v1`.
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}


SOUND_RMS = 0.01  # input above this (-40 dBFS) is sound: someone may be speaking over the answer

Handler = Callable[[dict[str, Any], str | None], Awaitable[None] | None]


class RealtimeConnection(Connection):
    def __init__(self, runtime: Runtime, beta: bool = False, audio_out: AudioOutput | None = None,
                 media_ok: bool = True, extensions: bool = False) -> None:
        super().__init__(runtime, audio_out, media_ok)
        self.beta = beta  # emit the beta protocol's event names
        self.output = RealtimeOutput(self, self.send)  # micro-turn outputs -> Realtime events
        self.extensions = extensions  # duplex's events and fields (server/extensions.py); else OpenAI's only
        # One table for every client event, whatever the transport.
        self._handlers: dict[str, Handler] = {
            "session.update": self._on_session_update,
            "input_audio_buffer.append": self._on_append,
            "input_audio_buffer.commit": self._on_commit,
            "input_audio_buffer.clear": self._on_clear,
            "conversation.item.create": self._on_item_create,
            "conversation.item.retrieve": self._on_item_retrieve,
            "conversation.item.delete": self._on_item_delete,
            "conversation.item.truncate": self._on_item_truncate,
            "response.create": self._on_response_create,
            "response.cancel": self._on_response_cancel,
            "output_audio_buffer.clear": self._on_output_clear,
            "duplex.background.request": self._background_event,
            "duplex.input_video.append": self._on_video_append,
        }
        self._frame_rate = FrameRate(VIDEO_FRAMES_PER_S, VIDEO_FRAME_BURST)  # duplex.input_video.append
        self._image_rate = FrameRate(VIDEO_FRAMES_PER_S, IMAGE_ITEM_BURST)  # input_image parts

    # -- the protocol's side of Connection ----------------------------------------------------

    def hello(self) -> None:
        s = self.session
        error = self._apply_minted_config()
        self.emit({"type": "session.created", "event_id": p.new_id("event"), "session": self.describe()})
        self.emit({"type": "duplex.session.resume", "event_id": p.new_id("event"), "session_id": s.id,
                   "resume_token": s.resume_token, "resumed": self.resumed, "tick": s.tick,
                   "grace_seconds": self.runtime.config.resume_grace})
        if error is not None:
            self.emit(self.error_event(error))

    def _apply_minted_config(self) -> ProtocolError | None:
        """The session config an ephemeral key was minted with (server/client_secrets.py), applied before
        `session.created` so that the session starts as the app's backend set it up. A resumed session keeps
        its own. It was checked at minting, but a transport may still refuse part of it (`pace: media` on
        WebRTC): then the session starts with the defaults and the client gets the error."""
        cfg = client_secrets.take(self)
        if cfg is None or self.resumed:
            return None
        s = self.session
        try:
            self.runtime.settings_changed(s, updated_settings(cfg, s.settings, s.audio_started, self.media_ok, None))
        except ProtocolError as exc:
            return exc
        self.apply_formats()
        return None

    def describe(self) -> dict[str, Any]:
        s = self.session
        cfg = s.settings
        return {
            "id": s.id, "object": "realtime.session", "type": "realtime", "model": self.runtime.model.name,
            "instructions": cfg.instructions, "output_modalities": [cfg.output_modality], "tools": cfg.tools,
            "tool_choice": cfg.tool_choice,
            "audio": {"input": {"format": cfg.in_format.describe(), "turn_detection": None},
                      "output": {"format": cfg.out_format.describe()}},
            "pace": cfg.pace.value, "duplex": {"tick_stats": cfg.tick_stats, "tick_ms": int(TICK_SECONDS * 1000),
                                                  "media_clock": cfg.media_clock},
        }

    @property
    def extensions(self) -> bool:
        return self.output.extensions

    @extensions.setter
    def extensions(self, on: bool) -> None:
        self.output.extensions = on

    def emit(self, event: dict[str, Any]) -> None:
        """Every event for the client: a tool call from the background worker becomes a whole response."""
        if event.get("type") == "response.function_call_arguments.done":
            previous = self.session.items.last_id() if self.session_id is not None else None
            asked = response_config.take_output(self.session)  # a response.create's, if one asked
            self.output.after_response(lc.function_call(
                p.new_id("resp"), str(event.get("item_id") or p.new_id("item")), str(event.get("call_id")),
                str(event.get("name")), str(event.get("arguments") or ""), previous,
                asked.modality_for(self.session.settings), asked.metadata))
            return
        if event.get("type") == "conversation.item.added" and event.get("item", {}).get("type") == \
                "function_call_output":  # the client's tool output, acknowledged as the API does
            item = {"object": "realtime.item", "status": "completed", **event["item"]}
            previous = self.session.items.last_id()
            self.send({**event, "previous_item_id": previous, "item": item})
            self.send({"type": "conversation.item.done", "event_id": p.new_id("event"), "previous_item_id": previous,
                       "item": item})
            return
        self.send(event)

    def send(self, event: dict[str, Any]) -> None:
        """One event as is, less duplex's extensions for a client that did not ask for them."""
        if event.get("type") == "conversation.item.done" and event.get("previous_item_id") is None:
            event["previous_item_id"] = self.session.items.before(str(event.get("item", {}).get("id")))
        if not self.extensions:
            filtered = plain(event)
            if filtered is None:
                return
            event = filtered
        super().emit(event)

    def outgoing(self, event: dict[str, Any]) -> dict[str, Any]:
        self.session.items.seen(event)  # every item the client is told of can be retrieved later
        if self.beta and event["type"] in BETA_NAMES:
            event["type"] = BETA_NAMES[event["type"]]
        return event

    def goodbye(self, code: int, reason: str) -> dict[str, Any]:
        return {"type": "duplex.session.closing", "event_id": p.new_id("event"), "code": code, "reason": reason}

    def error_event(self, exc: ProtocolError) -> dict[str, Any]:
        return p.error_event(exc.code, exc.message, exc.param, exc.event_id)

    def deliver(self, out: TickOutput, tick: int) -> None:
        if self.state is ConnState.OPEN:
            self.output.deliver(out, tick)

    async def push_audio(self, audio: np.ndarray) -> None:
        if audio.size and float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) > SOUND_RMS:
            self.output.heard_sound()
        await super().push_audio(audio)

    # -- client messages ----------------------------------------------------------------------

    async def handle_text(self, text: str) -> None:
        if not self.admit(len(text), "message"):
            return
        try:
            await self._dispatch(p.parse_client_text(text))
        except ProtocolError as exc:
            self.error(exc)

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
        self.apply_formats()
        self.emit({"type": "session.updated", "event_id": p.new_id("event"), "session": self.describe()})

    async def _on_append(self, ev: dict[str, Any], eid: str | None) -> None:
        await self.handle_audio_bytes(p.decode_audio_b64(ev.get("audio"), eid), eid)

    def _on_commit(self, ev: dict[str, Any], eid: str | None) -> None:
        # Input is stepped every micro-turn anyway; a commit ends the user's open turn as an item, if any.
        if self.output.commit_now() is None:
            self.emit({"type": "input_audio_buffer.committed", "event_id": p.new_id("event"),
                       "item_id": p.new_id("item"), "previous_item_id": self.session.items.last_id()})

    def _on_clear(self, ev: dict[str, Any], eid: str | None) -> None:
        self.runtime.clear_input(self.session)
        self.emit({"type": "input_audio_buffer.cleared", "event_id": p.new_id("event")})

    async def _on_item_create(self, ev: dict[str, Any], eid: str | None) -> None:
        s = self.session
        item = ev.get("item")
        after = self._previous_item(ev, eid)
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            self._background_event(ev, eid)
            return
        if isinstance(item, dict) and item.get("type", "message") != "message":
            # function_call, image, ...: taken as typed text before (found by bench.reliability.fuzz)
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
                self.output.typed(text)
            except TextFull as exc:
                self.runtime.metrics.dropped_events.labels("inbox_full").inc()
                raise ProtocolError("text_buffer_full", str(exc), "item.content", eid) from None
        content: list[dict[str, Any]] = [{"type": "input_image", "width": int(f.shape[1]), "height": int(f.shape[0])}
                                         for f in frames]
        if said:
            content.append({"type": "input_text", "text": text})
        given = item.get("id") if isinstance(item, dict) else None
        item_id = given[:MAX_ID_CHARS] if isinstance(given, str) and given else p.new_id("item")
        added = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
                 "content": content}
        previous = s.items.last_id() if after is END else after
        s.items.put(added, after)
        self.emit({"type": "conversation.item.added", "event_id": p.new_id("event"), "previous_item_id": previous,
                   "item": added})
        self.emit({"type": "conversation.item.done", "event_id": p.new_id("event"), "previous_item_id": previous,
                   "item": added})

    def _previous_item(self, ev: dict[str, Any], eid: str | None) -> str | None:
        """Where `conversation.item.create` puts its item: after `previous_item_id` ('root': first), else last."""
        previous = ev.get("previous_item_id")
        if previous is None:
            return END
        if previous == "root":
            return None
        if not isinstance(previous, str) or self.session.items.get(previous) is None:
            raise ProtocolError("item_not_found", f"previous_item_id {str(previous)[:64]!r} names no item of this "
                                "conversation (use 'root' for its start)", "previous_item_id", eid)
        return previous

    def _known_item(self, ev: dict[str, Any], eid: str | None) -> tuple[str, dict[str, Any]]:
        item_id = ev.get("item_id")
        if not isinstance(item_id, str) or not item_id:
            raise ProtocolError("invalid_item_id", f"{ev['type']} needs a string 'item_id'", "item_id", eid)
        item = self.session.items.get(item_id)
        if item is None:
            raise ProtocolError("item_not_found", f"no conversation item {item_id[:64]!r} in this session (unknown, "
                                f"deleted, or older than the last {MAX_ITEMS} items kept)", "item_id", eid)
        return item_id, item

    def _on_item_delete(self, ev: dict[str, Any], eid: str | None) -> None:
        # The model's memory keeps what it heard; the conversation's items (what retrieve reads) drop it.
        item_id, _ = self._known_item(ev, eid)
        self.session.items.delete(item_id)
        self.emit({"type": "conversation.item.deleted", "event_id": p.new_id("event"), "item_id": item_id})

    def _on_item_truncate(self, ev: dict[str, Any], eid: str | None) -> None:
        """The client played the assistant's audio only up to `audio_end_ms`: the rest was never heard."""
        item_id, item = self._known_item(ev, eid)
        end_ms = ev.get("audio_end_ms")
        if isinstance(end_ms, bool) or not isinstance(end_ms, int) or end_ms < 0:
            raise ProtocolError("invalid_audio_end_ms", "conversation.item.truncate needs a non-negative integer "
                                "'audio_end_ms'", "audio_end_ms", eid)
        if item.get("type") != "message" or item.get("role") != "assistant":
            raise ProtocolError("invalid_item", "only an assistant message's audio can be truncated", "item_id", eid)
        if item_id == self.output.item_id:  # still being spoken: it stops here, as a cancel
            self.output.silence_before(self.session.tick)
            self.runtime.cancel(self.session)
            self.output.finish_response("cancelled", "client_cancelled")
        text = self.output.truncated_text(item_id, end_ms)
        if text is not None:
            kept = self.session.items.get(item_id) or item
            part = {"type": "output_audio", "transcript": text}
            if [c.get("type") for c in kept.get("content", [])] == ["output_text"]:  # a text-only session's
                part = {"type": "output_text", "text": text}
            self.session.items.put({**kept, "content": [part]})
        self.emit({"type": "conversation.item.truncated", "event_id": p.new_id("event"), "item_id": item_id,
                   "content_index": int(ev.get("content_index") or 0), "audio_end_ms": end_ms})

    def _on_item_retrieve(self, ev: dict[str, Any], eid: str | None) -> None:
        _, item = self._known_item(ev, eid)
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
        # The model decides when to speak every micro-turn; a client request is only a hint. Its `response`
        # object, checked whole first (a bad field changes nothing), configures the next background request
        # and the next response, replacing what an earlier response.create left untaken.
        s = self.session
        s.next_request, s.next_output = response_config.parse(ev.get("response"), s.settings, eid)
        self.runtime.respond(s)

    def _on_response_cancel(self, ev: dict[str, Any], eid: str | None) -> None:
        s = self.session
        if self.audio_out is not None:
            self.audio_out.clear()  # what is queued for the speaker stops now
        if self.output.response_id is None:
            raise ProtocolError("response_cancel_not_active", "there is no active response to cancel", None, eid)
        self.output.silence_before(s.tick)  # ticks already in flight are silenced
        self.runtime.cancel(s)
        self.output.finish_response("cancelled", "client_cancelled")

    def _on_output_clear(self, ev: dict[str, Any], eid: str | None) -> None:
        self.output.silence_before(self.session.tick)
        if self.audio_out is not None:
            dropped_ms = self.audio_out.clear()
            self.emit({"type": "output_audio_buffer.cleared", "event_id": p.new_id("event"),
                       "response_id": self.output.response_id or self.output.last_response_id or "",
                       "dropped_ms": dropped_ms})

    def _background_event(self, ev: dict[str, Any], eid: str | None) -> None:
        if not self.runtime.client_event(self.session, ev):
            raise ProtocolError("background_unavailable", "this server runs no background reasoner "
                                "(start it with --background)", "type", eid)
