"""GPT-Live over WebRTC: `POST /v1/live/sessions` with `{session, transport: {type: "webrtc", sdp}}`.

The answer is the protocol's (the openai SDK's `client.live.create` reads it): 201 `{"session": {"id"},
"transport": {"type": "webrtc", "sdp": "<answer>"}}`, with `Location: /v1/live/sessions/{id}`. Creating
the call starts the session with the request's configuration; `session.started` is the first event on
the data channel once it opens (any label: clients use `oai-events`). Events are GPT-Live's, from the
same `LiveConnection` as the WebSocket; the audio is the media track both ways (Opus), so there is no
`session.input_audio.append` nor `session.output_audio.delta`. The call is the Realtime one
(server/_rtc_call.py, opened by server/webrtc.py's `Calls`), with `LiveCodec` as its codec.

At the door, what `/v1/realtime/calls` checks: the Origin, the key (APIKeyMiddleware; an ephemeral key
is spent here), admission and the per-client cap (`Runtime.attach`), a resume token in
`X-Duplex-Resume-Token`; refusals carry the protocol's error body `{"error": {type, code, message,
param, client_event_id}}`.

`POST /v1/live/sessions/{id}/hangup` (GPT-Live's SIP verb) ends a call and its session at once, as
`/v1/realtime/calls/{id}/hangup` does; a client normally sends `session.close` on the data channel.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from server import client_secrets
from server._rtc_tracks import PacedAudioTrack
from server.auth import client_id, origin_ok, resume_token
from server.call_codec import CallCodec
from server.extensions import wants_extensions
from server.limits import MAX_OFFER_BYTES
from server.live import config as cfg_mod
from server.live.connection import LiveConnection, count_refusal
from server.live.events import LiveError, error_event
from server.outbox import Outbox
from server.runtime import Refused, Runtime
from server.sessions import Ended, OutputSink, Session
from server.webrtc import Calls, checked_offer, read_body
from streaming.types import Audio
from streaming.video import Frame

PATH = "/v1/live/sessions"
# The offer and a session configuration (instructions, input messages, tools) in one JSON body.
MAX_BODY_BYTES = MAX_OFFER_BYTES + 256 * 1024
_BODY_KEYS = {"session", "transport"}
_TRANSPORT_KEYS = {"type", "sdp"}


class LiveCodec:
    """A LiveConnection as a WebRTC call's codec (server/_rtc_call.py's CallCodec)."""

    protocol = "live"

    def __init__(self, conn: LiveConnection) -> None:
        self.conn = conn
        self.outbox: Outbox = conn.outbox

    @property
    def sink(self) -> OutputSink:
        return self.conn

    @property
    def session(self) -> Session:
        return self.conn.session_or_fail()

    @property
    def session_id(self) -> str | None:
        return self.conn.session.id if self.conn.session is not None else None

    @property
    def pings(self) -> bool:
        return self.conn.extensions  # a duplex event: only for a client that asked for them

    async def handle_message(self, msg: str | bytes) -> None:
        if isinstance(msg, bytes):
            self.conn.handle_binary()
        else:
            await self.conn.handle_text(msg)

    def report(self, code: str, message: str) -> None:
        self.conn.error(LiveError(code, message, kind="server_error" if code == "internal_error" else
                                  "invalid_request_error"))

    def end(self, code: int, reason: str) -> None:
        self.conn.end(code, reason)

    def push_audio(self, audio: Audio) -> None:
        self.conn.push_rtc_audio(audio)

    def push_video(self, frame: Frame) -> None:
        if self.conn.extensions:  # GPT-Live takes no pictures; duplex's camera is an extension
            self.conn.runtime.push_video(self.session, frame)

    def ended(self, peer_seen: bool) -> Ended:
        if self.conn.said_goodbye:
            return Ended.GOODBYE
        return Ended.DROPPED if peer_seen else Ended.NEVER_CONNECTED

    def release(self) -> None:
        self.conn.release()


def _error(status: int, code: str, message: str, param: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse({"error": error_event(code, message, param, kind=kind)["error"]}, status_code=status,
                        headers=headers)


def _transport_offer(body: dict[str, Any]) -> str:
    """`transport.sdp` of a `{type: "webrtc", sdp}` transport; LiveError names what is wrong."""
    transport = body.get("transport")
    if not isinstance(transport, dict):
        raise LiveError("missing_required_parameter", "transport is required: {\"type\": \"webrtc\", \"sdp\": "
                        "<the SDP offer>}", "transport")
    for key in transport:
        if key not in _TRANSPORT_KEYS:
            raise LiveError("unknown_parameter", f"unknown parameter 'transport.{str(key)[:64]}'",
                            f"transport.{str(key)[:64]}")
    if transport.get("type") != "webrtc":
        raise LiveError("invalid_value", "transport.type must be 'webrtc' (the WebSocket is GET "
                        f"{PATH})", "transport.type")
    sdp = transport.get("sdp")
    if not isinstance(sdp, str):
        raise LiveError("missing_required_parameter", "transport.sdp must be the SDP offer "
                        "(RTCPeerConnection.createOffer().sdp)", "transport.sdp")
    return sdp


def _request(raw: bytes, reasoner: bool) -> tuple[cfg_mod.LiveConfig, str]:
    """The body -> (the session's configuration, the offer); LiveError names the first problem."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise LiveError("invalid_json", "the body is not JSON: send {\"session\": {...}, \"transport\": "
                        "{\"type\": \"webrtc\", \"sdp\": ...}}") from None
    if not isinstance(body, dict):
        raise LiveError("invalid_json", "the body must be a JSON object {session, transport}")
    for key in body:
        if key not in _BODY_KEYS:
            raise LiveError("unknown_parameter", f"unknown parameter {str(key)[:64]!r}", str(key)[:64])
    offer = _transport_offer(body)
    if body.get("session") is None:
        raise LiveError("missing_required_parameter", "session is required (at least {\"model\": ...})", "session")
    return cfg_mod.resolve(body["session"], None, reasoner=reasoner, webrtc=True), offer


async def _create(request: Request) -> Response:
    calls: Calls = request.app.state.webrtc_calls
    runtime: Runtime = calls.runtime
    try:
        origin = request.headers.get("origin")
        if not origin_ok(origin, runtime.allowed_origins):
            raise Refused("origin_not_allowed", f"origin {origin!r} is not allowed; start the server with "
                          "--allow-origin ORIGIN", 403)
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise Refused("unsupported_media_type", f"expected a JSON body ('application/json'), got "
                          f"{ctype or 'no content type'!r}", 415)
        raw = await read_body(request, MAX_BODY_BYTES, "request_too_large", "the request")
        try:
            config, sdp = _request(raw, reasoner=runtime.reasoner is not None)
        except LiveError as exc:
            runtime.metrics.client_error(exc.code, "live")
            return _error(400, exc.code, exc.message, exc.param)
        offer = checked_offer(sdp, runtime, "transport.sdp")
        ephemeral = request.scope.get(client_secrets.SCOPE_KEY)  # spent by APIKeyMiddleware (server/auth.py)
        if ephemeral:
            request.app.state.client_secrets.take_config(ephemeral)  # a Realtime configuration: not for a live session
        conn = LiveConnection(runtime, client_id(request.scope), resume_token(request),
                              wants_extensions(request.headers))

        def codec(track: PacedAudioTrack) -> CallCodec:
            conn.audio_out = track
            return LiveCodec(conn)

        call, answer = await calls.open_call(offer, codec, lambda _call: conn.start_with(config, media=False))
    except Refused as exc:
        count_refusal(runtime.metrics, exc)
        return _error(exc.http_status, exc.code, exc.message, headers=exc.headers)
    sid = call.session.id
    return JSONResponse({"session": {"id": sid}, "transport": {"type": "webrtc", "sdp": answer}}, status_code=201,
                        headers={"Location": f"{PATH}/{sid}"})


async def _hangup(session_id: str, request: Request) -> JSONResponse:
    calls: Calls = request.app.state.webrtc_calls
    origin = request.headers.get("origin")  # state-changing: another site's page may not end a call
    if not origin_ok(origin, calls.runtime.allowed_origins):
        return _error(403, "origin_not_allowed", f"origin {origin!r} is not allowed; start the server with "
                      "--allow-origin ORIGIN")
    if not await calls.hangup(session_id):
        return _error(404, "session_not_found", f"no live WebRTC session {session_id[:80]!r}; it has ended or "
                      "never existed", "session_id")
    return JSONResponse({"id": session_id, "status": "closed"})


def register_routes(app: FastAPI) -> None:
    """`POST /v1/live/sessions` and its hangup; they use the WebRTC `Calls` of `app.state.webrtc_calls`
    (server/webrtc.py)."""
    app.add_api_route(PATH, _create, methods=["POST"], status_code=201, response_model=None)
    app.add_api_route(PATH + "/{session_id}/hangup", _hangup, methods=["POST"], response_model=None)
