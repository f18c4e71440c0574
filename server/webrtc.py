"""WebRTC endpoint: SDP offer/answer over HTTP, one peer connection = one session.

Like the OpenAI Realtime WebRTC mode:

    POST /v1/realtime/calls                 body: the SDP offer (application/sdp)
        201 Created, body: the SDP answer, Location: /v1/realtime/calls/{call_id}
        header X-Duplex-Resume-Token: T (or ?resume_token=T) resumes a detached session (WebSocket
        or WebRTC) instead of opening one; the greeting carries a new token (tokens rotate)
    POST /v1/realtime/calls/{call_id}/hangup   ends the call and closes its session now
    GET  /v1/realtime/calls/ice                the ICE servers (STUN/TURN) browsers should use

Refusals carry a JSON body `{"error": {"type", "code", "message"}}`: 503 `server_full` (with
Retry-After) or `server_shutting_down`, 429 `too_many_sessions`, 400 `invalid_sdp` / `too_many_media`,
413 `offer_too_large`, 404 `invalid_resume_token`, 409 `pace_unsupported`, 415
`unsupported_media_type`, 403 `origin_not_allowed`; the API key is checked by the middleware (401).
The call itself (tracks, data channel, liveness) lives in server/_rtc_call.py. GPT-Live's WebRTC door
(`POST /v1/live/sessions`, server/live/rtc.py) opens its calls here too (`Calls.open_call`), with its
own connection as the call's codec, and checks its offer with `checked_offer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from server import client_secrets
from server._rtc_call import RtcCall
from server._rtc_tracks import PacedAudioTrack
from server.auth import client_id, origin_ok, resume_token
from server.call_codec import CallCodec, RealtimeCodec
from server.extensions import wants_extensions
from server.ice_candidates import TooManyCandidates, filter_offer
from server.limits import MAX_OFFER_BYTES, MAX_OFFER_MLINES
from server.protocol import ProtocolError
from server.runtime import Ended, Refused, Runtime
from server.sessions import Session

log = logging.getLogger(__name__)


def parse_ice_server(url: str) -> RTCIceServer:
    """`stun:host:port` or `turn:user:pass@host:port[?transport=tcp]` -> RTCIceServer (credentials apart)."""
    scheme, sep, rest = url.partition(":")
    if not sep or scheme not in ("stun", "stuns", "turn", "turns") or not rest:
        raise ValueError(f"ICE server {url!r} is not a stun:, stuns:, turn: or turns: URL "
                         "(e.g. stun:stun.example.org:3478 or turn:user:pass@turn.example.org:3478)")
    creds, at, hostpart = rest.rpartition("@")
    if not at:
        return RTCIceServer(urls=url)
    username, colon, credential = creds.partition(":")
    if not colon:
        raise ValueError(f"ICE server {url!r}: credentials must be 'user:password@'")
    return RTCIceServer(urls=f"{scheme}:{hostpart}", username=username, credential=credential)


def ice_config(urls: list[str]) -> list[RTCIceServer]:
    return [parse_ice_server(u) for u in urls]


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse({"error": {"type": kind, "code": code, "message": message}}, status_code=status,
                        headers=headers)


class Calls:
    """The live peer connections of this server. Their sessions live in the runtime's registry, like
    the WebSocket ones; a call is found from its session (its sink is the call's connection)."""

    def __init__(self, runtime: Runtime, ice_servers: list[RTCIceServer]) -> None:
        self.runtime = runtime
        self.ice_servers = ice_servers
        self.live: set[RtcCall] = set()
        runtime.add_transport(self.close_all)  # the runtime's stop ends the peers, after its drain

    async def open(self, offer: str, resume_token: str | None, client: str, extensions: bool = False,
                   session_config: dict[str, Any] | None = None) -> tuple[RtcCall, str]:
        """A Realtime call: attach (new or resumed) a session to a new call and answer the offer. Raises Refused."""

        def codec(track: PacedAudioTrack) -> CallCodec:
            made = RealtimeCodec(self.runtime, track, extensions)
            client_secrets.hand_over(made.conn, session_config)  # an ephemeral key's, for the connection to apply
            return made

        return await self.open_call(offer, codec, lambda call: self.runtime.attach(call.conn, resume_token, client,
                                                                                   media=False))

    async def open_call(self, offer: str, codec: Callable[[PacedAudioTrack], CallCodec],
                        attach: Callable[[RtcCall], Awaitable[Session]]) -> tuple[RtcCall, str]:
        """A call of either protocol: `codec` makes its connection, `attach` gives it its session (raises
        Refused); then the offer is answered. Raises Refused."""
        runtime = self.runtime
        pc = RTCPeerConnection(RTCConfiguration(iceServers=self.ice_servers))
        call = RtcCall(runtime, pc, codec, on_end=self.live.discard)
        try:
            session = await attach(call)
        except Refused:
            with contextlib.suppress(Exception):
                await pc.close()
            raise
        try:
            answer = await call.answer(offer)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await pc.close()
            await runtime.detach(session, call.conn, Ended.NEVER_CONNECTED)  # the client never saw its greeting
            if isinstance(exc, ProtocolError):
                raise Refused(exc.code, exc.message, 400) from None
            if isinstance(exc, ValueError | AssertionError):  # aiortc's complaints about a malformed offer
                what = str(exc) or type(exc).__name__
                raise Refused("invalid_sdp", f"the SDP offer could not be used: {what}; send the offer "
                              "exactly as RTCPeerConnection.createOffer() produced it", 400) from None
            raise
        call.start()
        self.live.add(call)
        return call, answer

    def find(self, session_id: str) -> RtcCall | None:
        """The live call whose session has this id; None for an unknown, detached or WebSocket session."""
        session = self.runtime.session(session_id)
        sink = session.sink if session is not None else None
        return next((c for c in self.live if sink is not None and c.conn is sink), None)

    async def hangup(self, call_id: str) -> bool:
        call = self.find(call_id)
        if call is None:
            return False
        await self.runtime.close(call.session, "hung up by the client")
        await call.finish("hung up by the client")
        return True

    async def close_all(self) -> None:
        """Server shutdown: the sessions were already told why (drain); close every peer connection."""
        calls = list(self.live)
        for call in calls:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(call.wait_ended(), 1.0)  # let a draining call send its goodbye
            await call.finish("server shutting down")


async def read_body(request: Request, limit: int, code: str, what: str) -> bytes:
    """The body, read only up to `limit` bytes (a huge body is refused before it is all in memory);
    Refused(code, 413) past it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Refused(code, f"{what} is {declared} bytes, over {limit}", 413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Refused(code, f"{what} is over {limit} bytes", 413)
    return bytes(body)


def checked_offer(offer: str, runtime: Runtime, where: str = "the body") -> str:
    """An SDP offer as aiortc may see it: its shape checked, and the candidates the server will not try
    filtered out (aiortc would send STUN to every address the offer names). Raises Refused (400)."""
    if not offer.lstrip().startswith("v=0"):
        raise Refused("invalid_sdp", f"{where} is not an SDP offer (it must start with 'v=0'); send "
                      "RTCPeerConnection.createOffer().sdp", 400)
    mlines = sum(1 for line in offer.splitlines() if line.startswith("m="))
    if mlines > MAX_OFFER_MLINES:
        raise Refused("too_many_media", f"the offer has {mlines} media sections; at most {MAX_OFFER_MLINES} "
                      "are served (one audio, one video, the data channel)", 400)
    try:
        filtered, _ = filter_offer(offer, runtime.config.ice_public_only())
    except TooManyCandidates as exc:
        raise Refused("too_many_candidates", str(exc), 400) from None
    return filtered


async def _read_offer(request: Request, runtime: Runtime) -> str:
    """The offer body (application/sdp), checked. Raises Refused."""
    body = await read_body(request, MAX_OFFER_BYTES, "offer_too_large", "the offer")
    return checked_offer(body.decode("utf-8", errors="replace"), runtime)


def register_routes(app: FastAPI) -> None:
    """The WebRTC routes; they use the `Calls` the app's lifespan puts in `app.state.webrtc_calls`."""

    @app.post("/v1/realtime/calls", status_code=201, response_model=None)
    async def create_call(request: Request) -> Response:
        calls: Calls = request.app.state.webrtc_calls
        runtime = calls.runtime
        origin = request.headers.get("origin")
        if not origin_ok(origin, runtime.allowed_origins):
            return _error(403, "origin_not_allowed", f"origin {origin!r} is not allowed; start the server "
                          "with --allow-origin ORIGIN")
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/sdp", "text/plain"):
            return _error(415, "unsupported_media_type", f"expected the SDP offer as 'application/sdp', got "
                          f"{ctype or 'no content type'!r}")
        try:
            offer = await _read_offer(request, runtime)
        except Refused as exc:
            return _error(exc.http_status, exc.code, exc.message)
        try:
            ephemeral = request.scope.get(client_secrets.SCOPE_KEY)  # spent by APIKeyMiddleware (server/auth.py)
            config = request.app.state.client_secrets.take_config(ephemeral) if ephemeral else None
            call, answer = await calls.open(offer, resume_token(request), client_id(request.scope),
                                            wants_extensions(request.headers), config)
        except Refused as exc:
            runtime.metrics.client_errors.labels(exc.code).inc()
            return _error(exc.http_status, exc.code, exc.message, exc.headers)
        return Response(answer, status_code=201, media_type="application/sdp",
                        headers={"Location": f"/v1/realtime/calls/{call.session.id}"})

    @app.post("/v1/realtime/calls/{call_id}/hangup", response_model=None)
    async def hangup(call_id: str, request: Request) -> JSONResponse:
        origin = request.headers.get("origin")  # state-changing: another site's page may not end a call
        if not origin_ok(origin, request.app.state.webrtc_calls.runtime.allowed_origins):
            return _error(403, "origin_not_allowed", f"origin {origin!r} is not allowed; start the server "
                          "with --allow-origin ORIGIN")
        if not await request.app.state.webrtc_calls.hangup(call_id):
            return _error(404, "unknown_call", f"no live call {call_id!r}; it has ended or never existed")
        return JSONResponse({"id": call_id, "status": "closed"})

    @app.get("/v1/realtime/calls/ice")
    async def ice(request: Request) -> dict[str, Any]:
        calls: Calls = request.app.state.webrtc_calls
        servers = [{"urls": s.urls, **({"username": s.username, "credential": s.credential}
                                       if s.username else {})} for s in calls.ice_servers]
        return {"ice_servers": servers}
