"""`duplex cluster` as real processes on loopback: Redis, two echo replicas and HAProxy.

One cluster for the module (starting it costs a few seconds); every test leaves it with no session
held. Each replica admits 2 sessions.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from server.auth import token_replica
from tests.deploy._cluster import AGENT_SETTLE, Cluster, run_cluster
from tests.wsclient import TICK, collect_audio, open_ws, pcm16, random_pcm, recv_event, send, start_session

CAPACITY = 2  # per replica


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from run_cluster(tmp_path_factory.mktemp("cluster"), "--max-sessions", str(CAPACITY),
                           "--resume-grace", "20", "--drain-grace", "20")


async def _resume(url: str, token: str, carrier: str) -> tuple[ClientConnection, dict[str, Any], dict[str, Any]]:
    """Resume with `token` through the proxy, the token in a header, a subprotocol or the query."""
    if carrier == "header":
        ws = await open_ws(url, additional_headers={"X-Duplex-Resume-Token": token})
    elif carrier == "subprotocol":
        ws = await open_ws(url, subprotocols=["realtime", "duplex-resume-token." + token])
    else:
        ws = await open_ws(url + "?resume_token=" + token)
    created = await recv_event(ws)
    resumed = await recv_event(ws)
    return ws, created, resumed


async def test_sessions_spread_by_capacity_and_the_next_is_refused(cluster: Cluster) -> None:
    """T1: 2 replicas x 2 places: four sessions land two on each, the fifth is refused with 503."""
    held = [await start_session(cluster.url) for _ in range(2 * CAPACITY)]
    placed = [token_replica(resume["resume_token"]) for _, resume in held]
    assert sorted(placed) == ["r1", "r1", "r2", "r2"], placed
    with pytest.raises(InvalidStatus) as refused:
        await open_ws(cluster.url)
    assert refused.value.response.status_code == 503
    for rid in ("r1", "r2"):
        health = cluster.health(rid)
        assert health["sessions"] == CAPACITY and health["free"] == 0
    for ws, _ in held:
        await ws.close()
    cluster.wait_idle()
    # Places freed: a new session is admitted again.
    ws, _ = await start_session(cluster.url)
    await ws.close()
    cluster.wait_idle()


Held = tuple[ClientConnection, dict[str, Any]]  # a client's connection and its resume event


async def _owner_full(cluster: Cluster) -> tuple[Held, Held]:
    """Two sessions on one replica, none on the other. Once one of them drops, its owner is still full
    (the dropped session keeps its place), so the proxy's balancing would send any connection to the
    other replica: only the token's route can take a resume back to the owner."""
    opened = [await start_session(cluster.url) for _ in range(3)]
    by_replica: dict[str, list[Held]] = {}
    for ws, resume in opened:
        by_replica.setdefault(token_replica(resume["resume_token"]), []).append((ws, resume))
    full = next(rid for rid, held in by_replica.items() if len(held) == 2)
    for rid, held in by_replica.items():
        if rid != full:
            for ws, _ in held:
                await ws.close()
    await asyncio.sleep(AGENT_SETTLE)  # the proxy has heard that the owner is full and the other is not
    first, second = by_replica[full]
    return first, second


async def test_a_resume_returns_to_its_replica_with_its_conversation(cluster: Cluster) -> None:
    """T2: dropped, then resumed through the proxy (header, subprotocol, query): the same replica, the
    same session, the model's state where it was (echo:1 still holds the last chunk)."""
    other, (ws, resume) = await _owner_full(cluster)
    owner = token_replica(resume["resume_token"])
    chunks = [pcm16(random_pcm(TICK, seed=s)) for s in range(1, 6)]
    await ws.send(chunks[0] + chunks[1])
    assert (await collect_audio(ws, 2))[1] == chunks[0]
    token, tick = resume["resume_token"], 2
    for i, carrier in enumerate(("header", "subprotocol", "query")):
        ws.transport.abort()  # the network drops: no close frame
        await asyncio.sleep(0.3)
        ws, created, resumed = await _resume(cluster.url, token, carrier)
        assert created["session"]["id"] == resume["session_id"], carrier
        assert resumed["resumed"] is True and resumed["tick"] == tick, (carrier, resumed)
        assert token_replica(resumed["resume_token"]) == owner and resumed["resume_token"] != token
        # The delay line held the chunk sent before the drop: it comes out next.
        await ws.send(chunks[2 + i])
        assert (await collect_audio(ws, 1)) == {tick: chunks[1 + i]}, carrier
        token, tick = resumed["resume_token"], tick + 1
    await ws.close()
    await other[0].close()
    cluster.wait_idle()


async def test_a_resume_reaches_its_owner_after_the_proxy_restarts(cluster: Cluster) -> None:
    """T8: the proxy is killed mid-session; the launcher starts it again and a resume still reaches the
    replica that holds the session (routing is in the token, not in the proxy's memory)."""
    (other_ws, other), (ws, resume) = await _owner_full(cluster)
    owner = token_replica(resume["resume_token"])
    old = cluster.state["proxy"]
    os.kill(old["pid"], signal.SIGKILL)
    for conn in (ws, other_ws):
        with pytest.raises(ConnectionClosed):  # every connection went with the proxy
            while True:
                await recv_event(conn, timeout=5)
    deadline = time.monotonic() + 15
    while cluster.state["proxy"]["pid"] == old["pid"]:
        assert time.monotonic() < deadline, cluster.log_path.read_text()
        await asyncio.sleep(0.1)
    assert cluster.state["proxy"]["restarts"] == old["restarts"] + 1
    await asyncio.sleep(AGENT_SETTLE)  # the new proxy has the agents' figures: the owner is full
    for held in (resume, other):
        ws, created, resumed = await _resume(cluster.url, held["resume_token"], "header")
        assert created["session"]["id"] == held["session_id"] and resumed["resumed"] is True
        assert token_replica(resumed["resume_token"]) == owner
        await ws.close()
    cluster.wait_idle()


async def test_a_webrtc_call_through_the_proxy(cluster: Cluster) -> None:
    """POST /v1/realtime/calls through the proxy: the replica that answers carries the call (media peer
    to peer with it), and the hangup, which names the session, reaches that replica."""
    pytest.importorskip("aiortc")
    from bench._rtc_client import RtcClient

    proxy = cluster.url.replace("ws://", "http://").removesuffix("/v1/realtime")
    held = [await start_session(cluster.url) for _ in range(2)]  # one WebSocket on each replica
    client = RtcClient(proxy)
    await client.connect()
    try:
        resume = await client.wait_for("duplex.session.resume")
        owner = token_replica(resume["resume_token"])
        assert resume["session_id"].startswith(f"sess_{owner}_")
        # Only the owner keeps a connection: least-connections alone would send the hangup elsewhere.
        for ws, r in held:
            if token_replica(r["resume_token"]) != owner:
                await ws.close()
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "via proxy"}]}})
        assert (await client.wait_for("response.output_audio_transcript.delta"))["delta"] == "via proxy"
        assert await client.hangup() == 200
    finally:
        await client.close()
        for ws, _ in held:
            await ws.close()
    cluster.wait_idle()


async def test_a_gpt_live_session_through_the_proxy_resumes_on_its_replica(cluster: Cluster) -> None:
    """/v1/live/sessions through the proxy: started on a replica, dropped, and resumed there with the
    token in the header (the proxy routes it by the token's replica, whatever the path)."""
    live_url = cluster.url.removesuffix("/v1/realtime") + "/v1/live/sessions"
    other = [await start_session(cluster.url) for _ in range(2)]  # least-connections has a choice to make
    ws = await open_ws(live_url)
    await send(ws, {"type": "session.start", "session": {"model": "gpt-live-1"}})
    started, greeting = await recv_event(ws), await recv_event(ws)
    assert started["type"] == "session.started" and greeting["type"] == "duplex.session.resume", (started, greeting)
    owner = token_replica(greeting["resume_token"])
    await ws.close(code=4000)  # a drop, not a goodbye: the session waits for its resume
    for held_ws, held in other:  # the owner's side is now the busier: a balanced request would go elsewhere
        if token_replica(held["resume_token"]) != owner:
            await held_ws.close()
    again = await open_ws(live_url, additional_headers={"X-Duplex-Resume-Token": greeting["resume_token"]})
    await send(again, {"type": "session.start", "session": {"model": "gpt-live-1"}})
    restarted, resumed = await recv_event(again), await recv_event(again)
    assert restarted["type"] == "session.started", restarted
    assert restarted["session"]["id"] == started["session"]["id"] == greeting["session_id"], restarted
    assert resumed["resumed"] is True and token_replica(resumed["resume_token"]) == owner, resumed
    await send(again, {"type": "session.close"})
    assert (await _until(again, "session.closed"))["reason"] == "close_requested"
    await again.close()
    for held_ws, _ in other:
        await held_ws.close()
    cluster.wait_idle()


async def test_an_ephemeral_key_reaches_the_replica_that_minted_it(cluster: Cluster) -> None:
    """A browser app's backend mints a key through the proxy (any replica answers); the page connects
    with it through the proxy. Only the replica that minted the key holds it: the proxy routes on the
    replica id the key carries, even when balancing would choose the other (it holds fewer sessions)."""
    http = cluster.url.replace("ws://", "http://").removesuffix("/v1/realtime")
    for carrier in ("header", "subprotocol"):
        minted = httpx.post(http + "/v1/realtime/client_secrets", json={}, timeout=10)
        assert minted.status_code == 200, minted.text
        key = minted.json()["value"]
        minter = key.removeprefix("ek_").split(".")[0]
        assert minter in ("r1", "r2"), key
        held = []  # one session on the minting replica: least connections alone would pick the other
        while not any(token_replica(r["resume_token"]) == minter for _, r in held):
            assert len(held) < 3, "the proxy never placed a session on the key's replica"
            held.append(await start_session(cluster.url))
        for ws, r in held:
            if token_replica(r["resume_token"]) != minter:
                await ws.close()
        await asyncio.sleep(AGENT_SETTLE)
        kwargs: dict[str, Any] = ({"additional_headers": {"Authorization": f"Bearer {key}"}} if carrier == "header"
                                  else {"subprotocols": ["realtime", "openai-insecure-api-key." + key]})
        ws, resume = await start_session(cluster.url, **kwargs)
        assert token_replica(resume["resume_token"]) == minter, (carrier, key[:6], resume["resume_token"][:3])
        await ws.close()
        for held_ws, _ in held:
            await held_ws.close()
        cluster.wait_idle()


async def _until(ws: ClientConnection, etype: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = await recv_event(ws, deadline - time.monotonic())
        if event["type"] == etype:
            return event
    raise AssertionError(f"no {etype} within {timeout} s")


async def test_sigterm_drains_a_replica_while_its_sessions_go_on(cluster: Cluster) -> None:
    """SIGTERM on a replica (--drain-grace): its agent says drain, so new sessions go to the other; its
    live session is told (with its token), keeps streaming, and the replica exits once it has ended.
    Runs last: the replica is gone afterwards."""
    a_ws, a = await start_session(cluster.url)
    b_ws, b = await start_session(cluster.url)
    leaving, staying = token_replica(a["resume_token"]), token_replica(b["resume_token"])
    assert leaving != staying
    pid = cluster.replica(leaving)["pid"]
    os.kill(pid, signal.SIGTERM)
    draining = await recv_event(a_ws)
    assert draining["type"] == "duplex.session.draining", draining
    assert draining["resume_token"] == a["resume_token"] and draining["seconds_left"] == 20
    chunks = [pcm16(random_pcm(TICK, seed=s)) for s in (21, 22)]
    await a_ws.send(chunks[0] + chunks[1])
    assert (await collect_audio(a_ws, 2))[1] == chunks[0]  # it goes on
    await asyncio.sleep(AGENT_SETTLE)
    r = httpx.get(f"http://127.0.0.1:{cluster.replica(leaving)['port']}/healthz")
    assert r.status_code == 503 and r.json()["status"] == "draining"
    assert "duplex_drains_total 1.0" in httpx.get(f"http://127.0.0.1:{cluster.replica(leaving)['port']}/metrics").text
    # The draining replica takes no new session: the next fills the other, and the one after is refused
    # by the proxy (least connections alone would have sent it to the draining replica).
    new_ws, new = await start_session(cluster.url)
    assert token_replica(new["resume_token"]) == staying
    await asyncio.sleep(AGENT_SETTLE)
    with pytest.raises(InvalidStatus) as refused:
        await open_ws(cluster.url)
    assert refused.value.response.status_code == 503
    for ws in (new_ws, b_ws, a_ws):
        await ws.close()
    # a was the draining replica's last session: it finishes its drain now, not after the 20 s grace.
    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the drained replica did not exit"
        await asyncio.sleep(0.1)


async def test_the_store_needs_its_password_listens_on_loopback_and_no_argv_shows_it(cluster: Cluster) -> None:
    """Redis was started without AUTH, bound where --host said: any local user (or, with --host 0.0.0.0,
    anyone) could read every session and plant snapshots. Its password is in a file only the owner reads
    and in the replicas' environment, never in a command line `ps` shows."""
    import redis.asyncio as aioredis
    from redis.exceptions import AuthenticationError, ResponseError

    state = cluster.state
    anonymous = aioredis.Redis.from_url(state["store"]["url"])
    try:
        with pytest.raises((AuthenticationError, ResponseError), match=r"(?i)auth"):
            await anonymous.keys("duplex:*")
    finally:
        await anonymous.aclose()
    client = cluster.store_client()
    try:
        assert (await client.config_get("bind"))["bind"] == "127.0.0.1"
        assert await client.config_get("protected-mode") == {"protected-mode": "yes"}
    finally:
        await client.aclose()
    conf = Path(state["workdir"]) / "redis.conf"
    assert conf.stat().st_mode & 0o077 == 0
    password = next(ln.split()[1] for ln in conf.read_text().splitlines() if ln.startswith("requirepass "))
    for pid in [state["store"]["pid"], *(r["pid"] for r in state["replicas"])]:
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists():  # an earlier test may have stopped a replica
            assert password.encode() not in cmdline.read_bytes()
