"""Connections before they are requests, as a slowloris client holds them: raw sockets on loopback.

A connection that sends nothing, half a request's head (a byte a second), half a body, or a second
request left half-sent on a kept-alive connection is closed by the server within seconds, before any
authentication; a request whose head runs past the bound is closed at once. A WebSocket message far over
the frame limit closes the connection from its frame header instead of being buffered. An open
WebSocket, however quiet, is left alone.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import time

from server.connection_limits import MAX_HEAD_BYTES, REQUEST_TIMEOUT_S
from tests.wsclient import TICK, pcm16, random_pcm, recv_until, send, start_session

CLOSED_WITHIN_S = 10.0  # the floor; the server's deadline is REQUEST_TIMEOUT_S


async def _closed_after(host: str, port: int, chunks: list[bytes], every: float = 0.0) -> float:
    """Connect, send `chunks` (one each `every` seconds, then nothing), read until the server closes;
    the seconds from connecting to the close (inf if it stays open past CLOSED_WITHIN_S + 2)."""
    reader, writer = await asyncio.open_connection(host, port)
    t0 = time.monotonic()

    async def trickle() -> None:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(every)

    sender = asyncio.create_task(trickle())
    try:
        while await asyncio.wait_for(reader.read(65536), CLOSED_WITHIN_S + 2 - (time.monotonic() - t0)):
            pass  # a response to a whole request; then the half-sent one
        return time.monotonic() - t0
    except TimeoutError:
        return float("inf")
    except ConnectionResetError:
        return time.monotonic() - t0
    finally:
        sender.cancel()
        writer.close()


async def test_half_sent_requests_are_closed(duplex_server) -> None:
    server = duplex_server("--model", "echo:0")
    host, port = server.host, server.port
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    whole = head + b"\r\n"
    cases = {
        "silent": _closed_after(host, port, []),
        "half a head": _closed_after(host, port, [head]),
        "a head byte a second": _closed_after(host, port, [bytes([b]) for b in head], every=1.0),
        "half a body": _closed_after(host, port, [b"POST /v1/realtime/calls HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                  b"Content-Type: application/sdp\r\nContent-Length: 1000\r\n\r\nv=0"]),
        "a whole request, then half of one": _closed_after(host, port, [whole, head], every=0.5),
    }
    t0 = time.monotonic()
    closed = dict(zip(cases, await asyncio.gather(*cases.values()), strict=True))
    for name, after in closed.items():
        assert after <= CLOSED_WITHIN_S, f"{name}: still open after {CLOSED_WITHIN_S} s ({closed})"
    assert closed["silent"] >= REQUEST_TIMEOUT_S - 0.5, "a new connection has the whole deadline"
    assert time.monotonic() - t0 < CLOSED_WITHIN_S + 3

    # A head past the bound is closed as soon as it is read, not at the deadline.
    flood = b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * (2 * MAX_HEAD_BYTES)
    assert await _closed_after(host, port, [flood]) < REQUEST_TIMEOUT_S / 2

    # A whole request is answered as before.
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head + b"Connection: close\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(4096), 5.0)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
    writer.close()


async def test_quiet_websocket_is_not_cut(duplex_server) -> None:
    server = duplex_server("--model", "echo:0")
    ws, _ = await start_session(server.ws_url, pace="media")
    await asyncio.sleep(REQUEST_TIMEOUT_S + 1.5)  # past the request deadline: a WebSocket is not a request
    chunk = pcm16(random_pcm(TICK, seed=2))
    await ws.send(chunk)
    delta, _ = await recv_until(ws, "response.output_audio.delta")
    assert base64.b64decode(delta["delta"]) == chunk
    await send(ws, {"type": "response.create"})
    await ws.close()


# --- a WebSocket message far over the frame limit, from a raw socket ----------------------------


def _rss_peak_reset(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", await reader.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", await reader.readexactly(8))[0]
    return b0 & 0x0F, await reader.readexactly(n)


async def test_huge_websocket_message_refused_from_its_header(duplex_server) -> None:
    server = duplex_server("--model", "echo:0")  # --max-frame-bytes: 256 kB
    reader, writer = await asyncio.open_connection(server.host, server.port)
    key = base64.b64encode(os.urandom(16))
    writer.write(b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\nX-Duplex-Extensions: 1\r\n\r\n")
    await writer.drain()
    status = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
    assert status.startswith(b"HTTP/1.1 101"), status
    for _ in range(2):  # session.created, duplex.session.resume
        opcode, _payload = await asyncio.wait_for(_read_frame(reader), 10.0)
        assert opcode == 1

    pid = server.proc.pid
    _rss_peak_reset(pid)
    rss0 = _status_kb(pid, "VmRSS")
    size = 12 << 20
    # A binary frame declaring 12 MiB, masked with a zero key (the payload goes as is), then the payload.
    writer.write(bytes([0x82, 0xFF]) + struct.pack(">Q", size) + bytes(4))
    payload = bytes(1 << 20)
    sent = 0
    try:
        for _ in range(size // len(payload)):
            writer.write(payload)
            await asyncio.wait_for(writer.drain(), 10.0)
            sent += len(payload)
    except (ConnectionError, TimeoutError):
        pass
    answers: list[tuple[int, bytes]] = []
    ended = False
    try:
        while not answers or answers[-1][0] != 8:
            answers.append(await asyncio.wait_for(_read_frame(reader), 5.0))
        ended = True
    except (asyncio.IncompleteReadError, ConnectionError):
        ended = True  # closed (a reset, as our unread bytes were still in its buffer)
    except TimeoutError:
        pass  # still open
    writer.close()
    grown_mb = (_status_kb(pid, "VmHWM") - rss0) / 1024
    texts = [p for op, p in answers if op == 1]
    assert not any(b"frame_too_large" in t for t in texts), "the 12 MiB message was read whole, then refused"
    assert ended, f"the connection stays open after a 12 MiB message ({len(texts)} events)"
    closes = [p for op, p in answers if op == 8]
    if closes and len(closes[0]) >= 2:
        assert struct.unpack(">H", closes[0][:2])[0] == 1009, closes
    assert grown_mb < 4, f"the server grew by {grown_mb:.1f} MB reading a message it refuses (sent {sent} bytes)"
