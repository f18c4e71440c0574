"""Ephemeral keys (POST /v1/realtime/client_secrets): minted with the server's key, the shape the OpenAI
SDK reads, one session each on the WebSocket (header or subprotocol) and the WebRTC offer, refused once
spent or expired, never in the log. The server is real (echo); the client is the openai SDK and
`websockets`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.realtime.client_secret_create_response import ClientSecretCreateResponse
from websockets.exceptions import InvalidStatus

from server.client_secrets import ClientSecrets, Full, Verdict
from tests.conftest import ServerProc, start_server
from tests.wsclient import open_ws, recv_event

KEY = "test-key-client-secrets"
TTL = 3  # --ephemeral-key-ttl: short, so that the expiry test waits little
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--ephemeral-key-ttl", str(TTL),
                       tmp_path=tmp_path_factory.mktemp("secrets"), env={"DUPLEX_API_KEY": KEY})
    yield srv
    srv.stop()


def mint(srv: ServerProc, body: dict[str, object] | None = None) -> str:
    r = httpx.post(f"{srv.url}/v1/realtime/client_secrets", json=body or {}, headers=AUTH)
    assert r.status_code == 200, r.text
    value: str = r.json()["value"]
    return value


async def refusal(srv: ServerProc, **kwargs: object) -> tuple[int, bytes]:
    with pytest.raises(InvalidStatus) as refused:
        await open_ws(srv.ws_url, **kwargs)  # type: ignore[arg-type]
    return refused.value.response.status_code, refused.value.response.body or b""


def test_minting_needs_the_server_key(keyed: ServerProc) -> None:
    url = f"{keyed.url}/v1/realtime/client_secrets"
    assert httpx.post(url, json={}).status_code == 401
    assert httpx.post(url, json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    ephemeral = mint(keyed)
    minted_with_ephemeral = httpx.post(url, json={}, headers={"Authorization": f"Bearer {ephemeral}"})
    assert minted_with_ephemeral.status_code == 401, "an ephemeral key cannot mint keys"
    # Nor does it open any endpoint but the transports.
    assert httpx.get(f"{keyed.url}/metrics", headers={"Authorization": f"Bearer {ephemeral}"}).status_code == 401


async def test_sdk_mints_a_key_that_opens_one_session(keyed: ServerProc) -> None:
    client = openai.AsyncOpenAI(api_key=KEY, base_url=f"{keyed.url}/v1")
    session = {"type": "realtime", "instructions": "Answer in one word."}
    before = time.time()
    created = await client.realtime.client_secrets.create(session=session,  # type: ignore[arg-type]
                                                          expires_after={"anchor": "created_at", "seconds": 3600})
    await client.close()
    assert isinstance(created, ClientSecretCreateResponse)
    assert created.value.startswith("ek_") and len(created.value) > 40
    # 3600 s asked, the server's TTL given: the client learns the real expiry.
    assert before - 1 <= created.expires_at <= before + TTL + 1
    assert created.session.type == "realtime" and created.session.instructions == "Answer in one word."

    auth = {"Authorization": f"Bearer {created.value}"}
    ws = await open_ws(keyed.ws_url, additional_headers=auth)
    first = await recv_event(ws)
    assert first["type"] == "session.created"
    # The session starts as the app's backend set it up when it minted the key.
    assert first["session"]["instructions"] == "Answer in one word.", first["session"]
    await ws.close()
    status, body = await refusal(keyed, additional_headers=auth)
    assert status == 401 and b"client_secret_used" in body and b"already used" in body


async def test_subprotocol_key_and_webrtc_offer(keyed: ServerProc) -> None:
    ephemeral = mint(keyed)
    ws = await open_ws(keyed.ws_url, subprotocols=["realtime", f"openai-insecure-api-key.{ephemeral}"])
    assert ws.subprotocol == "realtime", "the key's subprotocol is never echoed"
    assert (await recv_event(ws))["type"] == "session.created"
    await ws.close()
    status, _ = await refusal(keyed, subprotocols=["realtime", f"openai-insecure-api-key.{ephemeral}"])
    assert status == 401

    # WebRTC: the ICE servers may be read with a live key without spending it; the offer spends it.
    fresh = mint(keyed)
    auth = {"Authorization": f"Bearer {fresh}"}
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{keyed.url}/v1/realtime/calls/ice", headers=auth)).status_code == 200
        offer = await http.post(f"{keyed.url}/v1/realtime/calls", content=b"not sdp",
                                headers={**auth, "Content-Type": "application/sdp"})
        assert offer.status_code == 400, "the key was taken: the offer itself is what is refused"
        again = await http.post(f"{keyed.url}/v1/realtime/calls", content=b"v=0\r\n",
                                headers={**auth, "Content-Type": "application/sdp"})
        assert again.status_code == 401 and again.json()["error"]["code"] == "client_secret_used"
        spent_ice = await http.get(f"{keyed.url}/v1/realtime/calls/ice", headers=auth)
        assert spent_ice.status_code == 401


async def test_expired_and_unknown_keys_refused(keyed: ServerProc) -> None:
    short = mint(keyed, {"expires_after": {"anchor": "created_at", "seconds": 1}})
    late = mint(keyed)
    await asyncio.sleep(1.2)
    status, body = await refusal(keyed, additional_headers={"Authorization": f"Bearer {short}"})
    assert status == 401 and b"client_secret_expired" in body and b"expired" in body
    await asyncio.sleep(TTL - 1.0)  # the server's TTL passes too
    status, body = await refusal(keyed, additional_headers={"Authorization": f"Bearer {late}"})
    assert status == 401 and b"client_secret_expired" in body
    status, body = await refusal(keyed, additional_headers={"Authorization": "Bearer ek_never-minted"})
    assert status == 401 and b"invalid_api_key" in body


def test_bad_requests_and_the_log(keyed: ServerProc) -> None:
    url = f"{keyed.url}/v1/realtime/client_secrets"
    bad_session = httpx.post(url, json={"session": {"type": "realtime", "instructions": 5}}, headers=AUTH)
    assert bad_session.status_code == 400 and bad_session.json()["error"]["code"] == "invalid_instructions"
    transcription = httpx.post(url, json={"session": {"type": "transcription"}}, headers=AUTH)
    assert transcription.status_code == 400
    bad_expiry = httpx.post(url, json={"expires_after": {"anchor": "created_at", "seconds": 0}}, headers=AUTH)
    assert bad_expiry.status_code == 400
    assert httpx.post(url, content=b"[1]", headers=AUTH).status_code == 400
    minted = httpx.post(url, headers=AUTH)  # no body: a key with no session config
    assert minted.status_code == 200 and minted.headers["cache-control"] == "no-store"
    key = minted.json()["value"]
    assert key not in keyed.log() and "ek_" not in keyed.log(), "no key is ever logged"


def test_keys_bounded_in_memory() -> None:
    """The store itself (no server): at the cap minting is refused until keys expire, then expired and
    spent keys are evicted; a key is kept only as its hash."""
    now = [0.0]
    store = ClientSecrets(ttl_s=10.0, max_keys=3, clock=lambda: now[0])
    keys = [store.mint({"instructions": f"{i}"})[0] for i in range(3)]
    with pytest.raises(Full):
        store.mint()
    assert store.redeem(keys[0]) is Verdict.OK and store.redeem(keys[0]) is Verdict.SPENT
    assert store.take_config(keys[0]) == {"instructions": "0"} and store.take_config(keys[0]) is None
    assert all(k not in repr(store._grants) for k in keys)
    store.mint()  # the spent key made room
    now[0] = 11.0
    assert store.check(keys[1]) is Verdict.EXPIRED
    fresh = [store.mint()[0] for _ in range(3)]  # the expired ones made room
    assert len(store) == 3 and store.check(keys[1]) is Verdict.UNKNOWN
    assert all(store.check(k) is Verdict.OK for k in fresh)
