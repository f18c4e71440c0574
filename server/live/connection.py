"""One GPT-Live client connection: its client events in, the session's micro-turns out.

The connection is the session's `OutputSink`. Nothing is attached before `session.start`; then the
runtime opens (or resumes) a session and binds it here. Every micro-turn becomes one
`session.output_audio.delta` (silence included: the output is one continuous track), transcript
deltas stamped with the micro-turn's span (`start_ms`/`end_ms`, milliseconds from the session's
micro-turn 0), and a `session.delegation.created` where the model hands a request off. A bad command
is answered by one `error` event and changes nothing else.

Over WebRTC (server/live/rtc.py) the same connection serves the data channel: it is given the call's
output track (`audio_out`), which then takes the micro-turns' audio instead of `output_audio.delta`
events, the input audio comes as RTP instead of `session.input_audio.append`, and the session starts
with the configuration of the HTTP request (`start_with`) instead of a `session.start` event.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any

import numpy as np

from models.base import TickOutput
from server import protocol as p
from server.connection import AudioOutput
from server.live import config as cfg_mod
from server.live.audio import LiveAudio
from server.live.camera import LiveCamera
from server.live.config import LiveConfig
from server.live.context import TICK_MS, LiveContext
from server.live.delegation import to_live
from server.live.events import LiveError, check_fields, dumps, error_event, parse
from server.live.usage import USAGE_EVERY_TICKS, seconds, usage_event
from server.metrics import Metrics
from server.outbox import Close, Outbox
from server.runtime import Refused, Runtime
from server.sessions import Pace, Session
from streaming.types import Audio

log = logging.getLogger(__name__)

LIFETIME_S = 4 * 3600  # a live session's lifetime: `expires_at`, then session.closed{reason: expired}
ENDED_REASON = "expired"  # session.closed's reason when the server ends a session (idle, lifetime, shutdown)


def count_refusal(metrics: Metrics, exc: Refused) -> None:
    """A refused live session in the live series (the runtime counted a full server's in the total)."""
    metrics.client_error(exc.code, "live")
    if exc.code == "server_full":
        metrics.session_refused("live")


class State(Enum):
    WAITING = "waiting"  # no session.start yet
    STARTING = "starting"  # session.start accepted; the runtime is opening the session
    OPEN = "open"  # session.started sent
    CLOSING = "closing"  # session.closed sent (or the start was refused); nothing more goes out


Handler = Callable[[dict[str, Any], str | None], Awaitable[None] | None]


class LiveConnection:
    protocol = "live"  # for the metrics' per-protocol series (server/metrics.py)

    def __init__(self, runtime: Runtime, client: str, resume_token: str | None, extensions: bool = False,
                 audio_out: AudioOutput | None = None) -> None:
        self.runtime = runtime
        self.extensions = extensions  # the client asked for duplex's extension events (server/extensions.py)
        self.audio_out = audio_out  # WebRTC's output track; None: audio goes out as output_audio.delta events
        self.client = client  # for the per-client session cap
        self.resume_token = resume_token
        self.outbox = Outbox(runtime.config.max_outbox_bytes)
        self.cut = asyncio.Event()  # set when the client is cut for not reading
        self.state = State.WAITING
        self.said_goodbye = False  # session.close was served: the session is closed for good
        self._session: Session | None = None
        self._config: LiveConfig | None = None  # from session.start, until bound
        self.ctx: LiveContext | None = None
        self._audio: LiveAudio | None = None
        self.muted = False
        self._in_end = 0  # end_ms of the last input transcript fragment (stamps never go back)
        self._out_end = 0
        self._turn_start: int | None = None  # ms the user's current turn began (speech_started)
        self._handlers: dict[str, Handler] = {
            "session.start": self._on_start,
            "session.update": self._on_update,
            "session.close": self._on_close,
            "session.input_audio.append": self._on_append,
            "session.input_audio.mute": self._on_mute,
            "session.input_audio.unmute": self._on_mute,
            "session.instructions.append": self._on_context,
            "session.thinking.append": self._on_context,
            "session.commentary.append": self._on_context,
            "response.item.create": self._on_item_create,
            "response.create": self._on_response_create,
        }
        self._camera = LiveCamera(runtime) if extensions else None
        if self._camera is not None:
            self._handlers["duplex.input_video.append"] = self._on_video

    @property
    def transport(self) -> str:
        return "webrtc" if self.audio_out is not None else "websocket"

    @property
    def session(self) -> Session | None:
        return self._session

    # -- OutputSink --------------------------------------------------------------------------------

    def bind(self, session: Session, resumed: bool) -> None:
        """The runtime opened (or resumed) `session` for this connection: greet the client."""
        self._session = session
        held = session.background
        if isinstance(held, LiveContext):  # a resume: the session keeps the configuration it started with
            held.runtime = self.runtime
            self.ctx = held
        else:
            assert self._config is not None
            self.ctx = LiveContext(session, held, self._config, self.runtime)
            session.background = self.ctx
            if not resumed:
                self._configure(session, self._config)
        config = self.ctx.config
        self._audio = LiveAudio(config.format_type, config.rate)
        self.state = State.OPEN
        self._send({"type": "session.started", "event_id": p.new_id("event"), "session": self.describe()})
        self._send({"type": "duplex.session.resume", "event_id": p.new_id("event"), "session_id": session.id,
                    "resume_token": session.resume_token, "resumed": resumed,
                    "grace_seconds": self.runtime.config.resume_grace})

    def _configure(self, session: Session, config: LiveConfig) -> None:
        """A new session: the reasoner's instructions and client tools, then the startup history."""
        self.runtime.settings_changed(session, dataclasses.replace(
            session.settings, instructions=config.reasoner_instructions, tools=config.tools, pace=Pace(config.pace)))
        for msg in config.input:
            text = msg["content"][0]["text"]
            if msg["role"] == "developer":
                joined = "\n".join(x for x in (session.settings.instructions, text) if x)
                self.runtime.settings_changed(session, dataclasses.replace(session.settings, instructions=joined))
            else:
                session.log.add(0.0, "user" if msg["role"] == "user" else "assistant", text, kind="speech")

    def describe(self, status: str = "active") -> dict[str, Any]:
        """The SessionResource: the resolved configuration, its id and lifetime, and what serves it."""
        s, ctx = self._session, self.ctx
        assert s is not None and ctx is not None
        reasoner = self.runtime.reasoner
        config = ctx.config.describe()
        if self.audio_out is not None:  # WebRTC negotiates the codec on the media track: no format to echo
            config["audio"].pop("format", None)
        return {"id": s.id, "object": "live.session", "status": status,
                "expires_at": int(ctx.started_at + LIFETIME_S), **config,
                "duplex": {"model": self.runtime.model.name, "tick_ms": TICK_MS, "pace": ctx.config.pace,
                           "background": reasoner.name if reasoner is not None else None}}

    def emit(self, event: dict[str, Any]) -> None:
        """An event from the runtime or the background worker, in GPT-Live's terms."""
        tick = self._session.tick if self._session is not None else 0
        for ev in to_live(event, self.ctx if self._responses else None, tick):
            self._send(ev)

    @property
    def _responses(self) -> bool:
        return self.ctx is not None and self.ctx.config.delegation_type == "responses"

    def end(self, code: int, reason: str) -> None:
        """The server ends the session (idle, lifetime, shutdown, moved): say so, then hang up."""
        if self.state is State.OPEN:
            self._send(self._closed(ENDED_REASON, {"code": code, "message": reason}), bounded=False)
        self._hang_up(code, reason)

    def deliver(self, out: TickOutput, tick: int) -> None:
        if self.state is not State.OPEN:
            return
        ms = tick * TICK_MS
        if self.audio_out is not None:
            self.audio_out.push(out.audio)  # the media track, paced to the peer
        else:
            self._send({"type": "session.output_audio.delta", "delta": self._encode(out.audio)})
        if out.user_text:
            self._input_transcript(out.user_text, ms)
        if out.text:
            start = max(self._out_end, ms)
            self._out_end = ms + TICK_MS
            self._send({"type": "session.output_transcript.delta", "event_id": p.new_id("event"), "delta": out.text,
                        "start_ms": start, "end_ms": self._out_end})
        for ev in out.events:
            self._model_event(ev.type, ev.data, ms)
        if (tick + 1) % USAGE_EVERY_TICKS == 0:
            self._send(usage_event(self._session, tick + 1))
        if (tick + 1) * TICK_MS >= LIFETIME_S * 1000:
            asyncio.get_running_loop().create_task(self.runtime.close(self.session_or_fail(), "session lifetime over"))

    def session_or_fail(self) -> Session:
        assert self._session is not None
        return self._session

    def _encode(self, audio: np.ndarray) -> str:
        return base64.b64encode(self._audio.encode(audio)).decode("ascii") if self._audio is not None else ""

    def _input_transcript(self, text: str, ms: int) -> None:
        first = self._in_end == 0
        start = max(self._in_end, self._turn_start if self._turn_start is not None else ms)
        self._in_end = max(start, ms + TICK_MS)
        # Fragments concatenate as they are: each carries its own leading space.
        delta = text if first or text[:1].isspace() else " " + text
        self._send({"type": "session.input_transcript.delta", "event_id": p.new_id("event"), "delta": delta,
                    "start_ms": start, "end_ms": self._in_end})

    def _model_event(self, etype: str, data: dict[str, Any], ms: int) -> None:
        if etype == "speech_started":
            self._turn_start = ms
        elif etype == "speech_stopped":
            self._turn_start = None
        elif etype == "delegate" and self.ctx is not None and not self._responses:
            did = self.ctx.new_delegation()
            self._send({"type": "session.delegation.created", "event_id": p.new_id("event"), "offset_ms": ms,
                        "delegation": {"id": did, "type": "delegation", "target": "client"}})
        elif etype == "error":
            self.runtime.metrics.client_error("model_error", "live")
            self._send(error_event("model_error", str(data.get("message", "model error")), kind="server_error"))
        # Other model events (backchannel, yielded, vision...) have no GPT-Live counterpart.

    def _closed(self, reason: str, detail: dict[str, Any] | None = None) -> dict[str, Any]:
        s = self.session_or_fail()
        event = {"type": "session.closed", "event_id": p.new_id("event"), "reason": reason,
                 "session": self.describe(), "usage": {"seconds": seconds(s.tick)}}
        if detail is not None:
            event["duplex"] = detail
        return event

    # -- sending --------------------------------------------------------------------------------------

    def _send(self, event: dict[str, Any], bounded: bool = True) -> None:
        if self.state is State.CLOSING:
            return
        text = dumps(event)
        if bounded and not self.outbox.fits(len(text)):
            # The client does not read: cut it (its session stays resumable); what is queued is dropped
            # so that the close frame is the next thing it reads.
            dropped = self.outbox.clear() + 1
            self.runtime.metrics.dropped_event("outbox_full", "live", dropped)
            log.warning("live session %s: client not reading; disconnecting it",
                        self._session.id if self._session is not None else "-")
            self._hang_up(1008, f"not reading: {dropped} events dropped; resume the session")
            self.cut.set()
            return
        self.outbox.put(text)

    def _hang_up(self, code: int, reason: str) -> None:
        if self.state is not State.CLOSING:
            self.state = State.CLOSING
            self.outbox.put(Close(code, reason))

    def error(self, exc: LiveError) -> None:
        self.runtime.metrics.client_error(exc.code, "live")
        self._send(exc.event())

    def release(self) -> None:
        """The transport is done: drop the resamplers (FFmpeg graphs with threads) now."""
        if self._audio is not None:
            self._audio.release()
            self._audio = None

    # -- client messages ------------------------------------------------------------------------------

    async def handle_text(self, text: str) -> None:
        if self.state is State.CLOSING:
            return
        try:
            limit = self.runtime.config.max_frame_bytes
            if len(text) > limit:
                raise LiveError("message_too_large", f"message of {len(text)} bytes is over the {limit}-byte limit; "
                                "send audio in smaller chunks")
            ev = parse(text, self.extensions)
            eid = ev.get("event_id") if isinstance(ev.get("event_id"), str) else None
            if self._session is not None:
                self._session.last_activity = time.monotonic()
            if ev["type"] != "session.start" and self.state is not State.OPEN:
                raise LiveError("session_not_started", f"{ev['type']} before session.start; send session.start first "
                                "and wait for session.started", "type", eid)
            result = self._handlers[ev["type"]](ev, eid)
            if result is not None:
                await result
        except LiveError as exc:
            self.error(exc)

    def handle_binary(self) -> None:
        self.error(LiveError("invalid_frame", "binary frames are not part of the protocol; send audio as "
                             "session.input_audio.append events (base64 in a JSON text frame)"))

    async def _on_start(self, ev: dict[str, Any], eid: str | None) -> None:
        if self.state is not State.WAITING:
            raise LiveError("session_already_started", "this connection already has a session; open another "
                            "connection for a new one", "type", eid)
        check_fields(ev, {"session"}, eid)
        config = cfg_mod.resolve(ev.get("session"), eid, reasoner=self.runtime.reasoner is not None)
        try:
            await self.start_with(config)
        except Refused as exc:
            count_refusal(self.runtime.metrics, exc)
            self._send(error_event(exc.code, exc.message, None, eid, kind="server_error"), bounded=False)
            self._hang_up(exc.ws_close, exc.message)

    async def start_with(self, config: LiveConfig, media: bool = True) -> Session:
        """Open (or resume) the session with `config`: `session.start`'s, or a WebRTC request's
        (`media=False`: pace 'media' cannot be served). Raises Refused (the caller reports it: `refused`)."""
        self._config = config
        self.state = State.STARTING
        if config.pace == Pace.MEDIA and not media:
            raise Refused("pace_unsupported", "pace 'media' needs the WebSocket: WebRTC audio arrives in real "
                          "time; leave session.duplex.pace out", 409, 1008)
        return await self.runtime.attach(self, self.resume_token, self.client, media=media)


    def _on_update(self, ev: dict[str, Any], eid: str | None) -> None:
        check_fields(ev, {"session"}, eid)
        ctx, s = self.ctx, self._session
        assert ctx is not None and s is not None
        ctx.config = cfg_mod.update(ctx.config, ev.get("session"), eid)
        if ctx.config.delegation_type == "responses":
            self.runtime.settings_changed(s, dataclasses.replace(
                s.settings, instructions=ctx.config.reasoner_instructions, tools=ctx.config.tools))
        self._send({"type": "session.updated", "event_id": p.new_id("event"), "client_event_id": eid,
                    "session": self.describe()})

    async def _on_close(self, ev: dict[str, Any], eid: str | None) -> None:
        s, ctx = self.session_or_fail(), self.ctx
        if ctx is not None and ctx.pending:
            self._send(error_event("context_injection_incomplete", f"{ctx.pending} appends had not reached the "
                                   "timeline when the session closed", None, eid), bounded=False)
        self._send(usage_event(s, s.tick), bounded=False)
        self._send(self._closed("close_requested"), bounded=False)
        self.said_goodbye = True
        self._hang_up(1000, "session closed")
        # Shielded: the writer ends the connection as soon as it has sent the close frame, and that
        # cancels this reader; the session must still be freed whole.
        await asyncio.shield(self.runtime.close(s))

    async def _on_append(self, ev: dict[str, Any], eid: str | None) -> None:
        check_fields(ev, {"audio"}, eid)
        if self.audio_out is not None:
            raise LiveError("unsupported_event", "over WebRTC the microphone is the media track; "
                            "session.input_audio.append is for the WebSocket", "type", eid)
        raw = ev.get("audio")
        if not isinstance(raw, str):
            raise LiveError("invalid_type", "'audio' must be a base64 string", "audio", eid)
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise LiveError("invalid_base64", "'audio' is not valid base64", "audio", eid) from None
        if self._audio is None:
            return  # the transport is done
        audio = self._audio.decode(data, eid)
        if self.muted:
            audio = np.zeros_like(audio)  # the model hears silence; the timeline goes on
        await self.runtime.push_audio(self.session_or_fail(), audio)

    def push_rtc_audio(self, audio: Audio) -> None:
        """Real-time audio of a WebRTC call's media track; muted, the model hears silence."""
        if self.state is State.OPEN:
            self.runtime.push_live_audio(self.session_or_fail(), np.zeros_like(audio) if self.muted else audio)

    async def _on_video(self, ev: dict[str, Any], eid: str | None) -> None:
        """duplex.input_video.append: a camera frame, for a client that asked for extensions."""
        check_fields(ev, {"image"}, eid)
        assert self._camera is not None
        frame = await self._camera.decode(ev.get("image"), eid)
        if self.state is State.OPEN:
            self.runtime.push_video(self.session_or_fail(), frame)

    def _on_mute(self, ev: dict[str, Any], eid: str | None) -> None:
        check_fields(ev, set(), eid)
        self.muted = ev["type"].endswith(".mute")
        self._send({"type": "session.input_audio.muted" if self.muted else "session.input_audio.unmuted",
                    "event_id": p.new_id("event"), "client_event_id": eid})

    def _on_context(self, ev: dict[str, Any], eid: str | None) -> None:
        check_fields(ev, {"content", "delegation_id"}, eid)
        assert self.ctx is not None
        self.ctx.append(ev["type"].split(".")[1], ev, eid)

    def _on_item_create(self, ev: dict[str, Any], eid: str | None) -> None:
        check_fields(ev, {"item"}, eid)
        self._need_responses(ev["type"], eid)
        item = ev.get("item")
        if not isinstance(item, dict) or item.get("type") != "function_call_output":
            raise LiveError("unsupported_item", "duplex takes function_call_output items only (the output of a "
                            "function_call it sent)", "item.type", eid)
        for key in ("call_id", "output"):
            if not isinstance(item.get(key), str):
                raise LiveError("invalid_type", f"item.{key} must be a string", f"item.{key}", eid)
        self.runtime.client_event(self.session_or_fail(), {"type": "conversation.item.create", "event_id": eid,
                                                           "item": item})

    def _on_response_create(self, ev: dict[str, Any], eid: str | None) -> None:
        check_fields(ev, {"response"}, eid)
        # The reasoner goes on as soon as every output it waits for is in: nothing more to start.
        self._need_responses(ev["type"], eid)

    def _need_responses(self, etype: str, eid: str | None) -> None:
        if not self._responses:
            raise LiveError("invalid_delegation_type", f"{etype} requires Responses delegation.", "type", eid)
