"""A WebRTC offer as an attacker writes it: ICE candidates naming the server's own network (here a UDP
socket on loopback standing for a metadata service or a private host), which the server's ICE agent
would probe with STUN, and an offer naming hundreds of candidates; on a real server."""

from __future__ import annotations

import asyncio
import socket

import httpx
from aiortc import RTCPeerConnection

from server.ice_candidates import MAX_OFFER_CANDIDATES, filter_offer

HEADERS = {"Content-Type": "application/sdp"}


async def _offer_naming(candidates: list[str]) -> str:
    pc = RTCPeerConnection()
    pc.addTransceiver("audio")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp: str = pc.localDescription.sdp
    await pc.close()
    lines = [ln for ln in sdp.split("\r\n") if not ln.startswith("a=candidate:")]  # only the attacker's
    first_m = next(i for i, ln in enumerate(lines) if ln.startswith("m="))
    end = next((i for i in range(first_m + 1, len(lines)) if lines[i].startswith("m=")), len(lines) - 1)
    return "\r\n".join(lines[:end] + candidates + lines[end:])


def _candidate(host: str, port: int, n: int = 1) -> str:
    return f"a=candidate:{n} 1 udp 2130706431 {host} {port} typ host"


async def _probed(url: str, extra: list[str], seconds: float = 2.0) -> int:
    """Whether the server sent a packet (STUN) to a UDP socket of ours that the offer named (0 or 1)."""
    target = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    target.bind(("127.0.0.1", 0))
    target.setblocking(False)
    port = target.getsockname()[1]
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(url + "/v1/realtime/calls", headers=HEADERS,
                            content=await _offer_naming([_candidate("127.0.0.1", port), *extra]))
        assert r.status_code == 201, r.text
        received = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            try:
                await asyncio.wait_for(loop.sock_recv(target, 2048), deadline - loop.time())
            except TimeoutError:
                break
            received += 1
            break  # one is enough: the server probed the address
        await http.post(url + r.headers["Location"] + "/hangup")
    target.close()
    return received


async def test_candidates_naming_the_servers_own_network_are_not_probed(duplex_server) -> None:
    open_server = duplex_server("--model", "echo", "--background", "none", "--ice-candidates", "any")
    assert await _probed(open_server.url, []) > 0  # what a loopback server did, and what `any` still does
    srv = duplex_server("--model", "echo", "--background", "none", "--ice-candidates", "public")
    extra = [_candidate("169.254.169.254", 80, 2), _candidate("10.1.2.3", 22, 3), _candidate("abcd.local", 9, 4)]
    assert await _probed(srv.url, extra) == 0
    many = [_candidate("203.0.113.9", 10000 + i, i) for i in range(MAX_OFFER_CANDIDATES + 1)]
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(srv.url + "/v1/realtime/calls", headers=HEADERS, content=await _offer_naming(many))
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_candidates", r.text


def test_only_globally_routable_addresses_are_kept() -> None:
    names = ["127.0.0.1", "169.254.169.254", "10.0.0.1", "192.168.1.2", "100.64.0.1", "::1", "fe80::1",
             "fd00::1", "::ffff:10.0.0.1", "host.local", "example.com", "0.0.0.0", "224.0.0.1", "8.8.8.8",
             "2001:4860:4860::8888"]
    sdp = "\r\n".join(["v=0", *(_candidate(h, 9, i) for i, h in enumerate(names)), ""])
    kept, dropped = filter_offer(sdp, public_only=True)
    assert dropped == len(names) - 2
    assert "8.8.8.8" in kept and "2001:4860:4860::8888" in kept
    assert filter_offer(sdp, public_only=False) == (sdp, 0)
