"""DNS rebinding against a keyless server on loopback: a page at attacker.example makes the browser
resolve its name to 127.0.0.1, and its requests then reach the server with `Host: attacker.example`;
they read /healthz, /metrics and the TURN credentials before. On a real server."""

from __future__ import annotations

import asyncio

import httpx

from server.host_check import host_name


async def test_a_rebound_name_is_refused_and_loopback_names_are_served(duplex_server) -> None:
    srv = duplex_server("--model", "echo", "--background", "none", "--ice-server", "turn:user:pass@turn.example:3478")
    async with httpx.AsyncClient(timeout=10) as http:
        for path in ("/healthz", "/metrics", "/v1/realtime/calls/ice"):
            r = await http.get(srv.url + path, headers={"Host": f"attacker.example:{srv.port}"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", (path, r.text)
            assert "pass" not in r.text
        for name in ("127.0.0.1", "localhost", "[::1]"):
            r = await http.get(srv.url + "/v1/realtime/calls/ice", headers={"Host": f"{name}:{srv.port}"})
            assert r.status_code == 200, name
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)  # the handshake as a browser sends it
    writer.write(b"GET /v1/realtime HTTP/1.1\r\nHost: attacker.example\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\n\r\n")
    status = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert status.split()[1] == b"403", status


def test_host_names() -> None:
    assert host_name("LocalHost:8000") == "localhost" and host_name("[::1]:80") == "::1"
    assert host_name("127.0.0.1") == "127.0.0.1" and host_name("::1") == "::1"
