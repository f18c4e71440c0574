"""WebRTC limits through the real server and real aiortc peers: offer size
and media sections, calls that never connect, the per-client session cap, deep JSON on the data channel."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from aiortc import RTCPeerConnection

from bench._rtc_client import CallRefused, RtcClient
from server.limits import MAX_OFFER_BYTES
from tests.conftest import ServerProc, start_server
from tests.wsclient import open_ws, recv_event, start_session

CONNECT_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo", "--background", "none", "--max-sessions", "4",
                       "--rtc-connect-timeout", str(CONNECT_TIMEOUT), "--resume-grace", "20",
                       tmp_path=tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


def sessions(srv: ServerProc) -> int:
    return int(httpx.get(srv.url + "/healthz", timeout=5).json()["sessions"])


async def until_sessions(srv: ServerProc, n: int, timeout: float) -> float:
    t0 = time.monotonic()
    while await asyncio.to_thread(sessions, srv) != n:
        assert time.monotonic() - t0 < timeout, f"sessions never became {n}"
        await asyncio.sleep(0.1)
    return time.monotonic() - t0


async def offer_sdp() -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection()
    pc.addTransceiver("audio")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def test_offer_size_and_media_sections_are_bounded(server: ServerProc) -> None:
    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the server must count as it reads
        yield b"v=0\r\n"
        for _ in range(64):
            yield b"a=x-padding:" + b"p" * 2048 + b"\r\n"

    headers = {"Content-Type": "application/sdp"}
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(server.url + "/v1/realtime/calls", content=chunked(), headers=headers)
        assert r.status_code == 413 and r.json()["error"]["code"] == "offer_too_large"
        r = await http.post(server.url + "/v1/realtime/calls", content=b"v=0\r\n" + b"x" * MAX_OFFER_BYTES,
                            headers=headers)
        assert r.status_code == 413
        many = "v=0\r\n" + "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n" * 8
        r = await http.post(server.url + "/v1/realtime/calls", content=many, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_media"
    assert await asyncio.to_thread(sessions, server) == 0


async def test_an_offer_missing_dtls_parameters_is_refused_with_a_reason(server: ServerProc) -> None:
    # aiortc failed with AttributeError deep inside setRemoteDescription: a 500 (found by bench.reliability.fuzz).
    pc, sdp = await offer_sdp()
    await pc.close()
    lines = sdp.split("\r\n")
    first_m = next(i for i, ln in enumerate(lines) if ln.startswith("m="))
    stripped = lines[:first_m] + [ln for ln in lines[first_m:] if not ln.startswith(("a=fingerprint", "a=setup"))]
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(server.url + "/v1/realtime/calls", content="\r\n".join(stripped),
                            headers={"Content-Type": "application/sdp"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_sdp", r.text
    assert "createOffer" in r.json()["error"]["message"]
    await until_sessions(server, 0, 5.0)  # the session opened for the call was closed at once


async def test_an_offer_missing_an_m_line_or_an_rtpmap_is_refused_with_a_reason(server: ServerProc) -> None:
    # The video section's m= line deleted: its attributes join the audio section, and aiortc's
    # createAnswer failed with AttributeError; an rtx rtpmap deleted: RuntimeError from a StopIteration.
    # Both were a 500 (found by bench.reliability.fuzz).
    pc = RTCPeerConnection()
    pc.addTransceiver("audio")
    pc.addTransceiver("video")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    lines = sdp.split("\r\n")
    rtx = next(i for i, ln in enumerate(lines) if ln.startswith("a=rtpmap:") and "rtx/" in ln)
    for broken in ("\r\n".join(ln for ln in lines if not ln.startswith("m=video")),
                   # a=fmtp:N apt=... left without its a=rtpmap:N: StopIteration inside aiortc
                   "\r\n".join(lines[:rtx] + lines[rtx + 1:])):
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(server.url + "/v1/realtime/calls", content=broken,
                                headers={"Content-Type": "application/sdp"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_sdp", r.text
        await until_sessions(server, 0, 5.0)


async def test_a_call_that_never_connects_frees_its_slot_at_the_connect_timeout(server: ServerProc) -> None:
    await until_sessions(server, 0, 5)
    pc, sdp = await offer_sdp()
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(server.url + "/v1/realtime/calls", content=sdp,
                            headers={"Content-Type": "application/sdp"})
    assert r.status_code == 201
    await pc.close()  # the answer is never applied: no ICE, no DTLS, no data channel
    assert await asyncio.to_thread(sessions, server) == 1
    waited = await until_sessions(server, 0, CONNECT_TIMEOUT + 4)
    assert waited < CONNECT_TIMEOUT + 4, "the slot is freed at the connect timeout, not after the resume grace"


async def test_a_resume_that_never_connects_leaves_the_old_token_working(server: ServerProc) -> None:
    await until_sessions(server, 0, 5)
    ws, first = await start_session(server.ws_url, pace="realtime")
    ws.transport.abort()
    await asyncio.sleep(0.3)
    pc, sdp = await offer_sdp()
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(server.url + "/v1/realtime/calls", content=sdp,
                            headers={"Content-Type": "application/sdp",
                                     "X-Duplex-Resume-Token": first["resume_token"]})
    assert r.status_code == 201
    await pc.close()
    await asyncio.sleep(CONNECT_TIMEOUT + 1.5)
    # The rotated token never reached the client; its old one must still resume the session.
    ws2 = await open_ws(server.ws_url, additional_headers={"X-Duplex-Resume-Token": first["resume_token"]})
    await recv_event(ws2)
    again = await recv_event(ws2)
    assert again["type"] == "duplex.session.resume" and again["resumed"] is True
    assert again["session_id"] == first["session_id"]
    await ws2.close()


async def test_deeply_nested_json_on_the_data_channel_is_an_error_and_the_call_goes_on(server: ServerProc) -> None:
    await until_sessions(server, 0, 5)
    client = RtcClient(server.url)
    await client.connect()
    try:
        await client.wait_for("duplex.session.resume")
        assert client._channel is not None
        client._channel.send("[" * 60_000)  # under the data channel's 64 kB message size
        err = await client.wait_for("error")
        assert err["error"]["code"] == "invalid_json"
        await client.send({"type": "session.update", "session": {"instructions": "still here"}})
        updated = await client.wait_for("session.updated")
        assert updated["session"]["instructions"] == "still here"
    finally:
        assert await client.hangup() == 200
        await client.close()


async def test_sessions_per_client_are_capped(duplex_server) -> None:
    srv = duplex_server("--model", "echo", "--background", "none", "--max-sessions", "4",
                        "--max-sessions-per-client", "1")
    ws, _ = await start_session(srv.ws_url, pace="realtime")
    second = await open_ws(srv.ws_url)
    err = await recv_event(second)
    assert err["error"]["code"] == "too_many_sessions"
    with pytest.raises(CallRefused) as refused:
        await RtcClient(srv.url).connect()
    assert refused.value.status == 429 and refused.value.code == "too_many_sessions"
    await ws.close()  # a goodbye frees the slot at once
    await until_sessions(srv, 0, 5)
    third, _ = await start_session(srv.ws_url, pace="realtime")
    await third.close()


async def test_a_message_past_the_advertised_window_ends_the_call_and_the_server_lets_go(server: ServerProc) -> None:
    """aiortc reassembled any message whole, whatever size it had advertised: a peer that ignores the
    advertised max-message-size (here: aiortc told to forget it) made the server hold all of it. Now the
    call ends once what is held passes the advertised window, and its place is free again."""
    await until_sessions(server, 0, 5)
    client = RtcClient(server.url)
    await client.connect()
    try:
        await client.wait_for("duplex.session.resume")
        sctp, channel = client.pc.sctp, client._channel
        assert sctp is not None and channel is not None
        sctp._remote_max_message_size = 0  # a hostile peer: no size check before sending
        channel.send(b"\0" * (4 << 20))  # 4 MiB as one message; the server advertised 256 kB and a 1 MiB window
        await until_sessions(server, 0, 10)  # well before the 20 s resume grace: closed, not kept
        log = server.log()
        assert "data channel flood" in log, log[-2000:]
    finally:
        await client.close()
    metrics = httpx.get(server.url + "/metrics", timeout=5).text
    assert 'duplex_dropped_events_total{reason="rtc_flood"} 1.0' in metrics


def _post_then_read_late(url: str, path: str, body: bytes, ctype: str, wait: float = 0.3) -> bytes:
    """A whole POST sent, then its answer read only after `wait`: by then a server that answered without
    reading the body has closed on unread bytes, and the kernel's reset has taken its answer away."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        sock.sendall(head + body)
        time.sleep(wait)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize(("path", "ctype", "status"), [
    ("/v1/realtime/calls", "application/sdp", b"413"),  # declared over the offer's bound
    ("/v1/live/sessions", "application/json", b"413"),
    ("/v1/realtime/calls", "text/html", b"415"),  # refused by its type, before any of the body is read
])
async def test_a_refused_offer_gets_its_answer_even_when_read_late(server: ServerProc, path: str, ctype: str,
                                                                   status: bytes) -> None:
    # Past what uvicorn buffers before it stops reading: without the drain, unread bytes at the close.
    body = b"v=0\r\n" + b"x" * 600_000
    answer = await asyncio.to_thread(_post_then_read_late, server.url, path, body, ctype)  # was a reset
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
