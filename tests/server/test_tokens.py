"""Resume tokens that name their replica and carry a MAC: only a replica can make one, and a replica
resumes only its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from server.auth import ResumeTokens, TokenCheck, token_replica
from tests.conftest import ServerProc, start_server
from tests.wsclient import TICK, collect_audio, open_ws, pcm16, random_pcm, recv_event, start_session

SECRET = "test-cluster-secret"


def test_tokens_name_their_replica_and_verify() -> None:
    ours, theirs = ResumeTokens("r1", SECRET), ResumeTokens("r2", SECRET)
    token = ours.mint()
    assert token_replica(token) == "r1" and ours.check(token) is TokenCheck.OURS
    assert ours.mint() != token
    assert ours.check(theirs.mint()) is TokenCheck.FOREIGN
    body, _, mac = token.rpartition(".")
    relabelled = "r2" + token[2:]  # another replica's name on our token: its MAC no longer verifies
    flipped = body + "." + ("A" if mac[0] != "A" else "B") + mac[1:]
    for bad in (relabelled, flipped, "r1", "r1.x", "", "r1..", body, token + "x"):
        assert ours.check(bad) is TokenCheck.FORGED, bad
    assert ResumeTokens("r1", "another secret").check(token) is TokenCheck.FORGED
    # Without a secret there is nothing to verify: the registry lookup decides.
    assert ResumeTokens("r1").check("anything") is TokenCheck.OURS
    with pytest.raises(ValueError):
        ResumeTokens("no.dots")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = start_server("--model", "echo", "--replica-id", "alpha", "--resume-grace", "10",
                        tmp_path=tmp_path_factory.mktemp("tokens"), env={"DUPLEX_CLUSTER_SECRET": SECRET})
    yield proc
    proc.stop()


async def _refused(url: str, **kwargs: object) -> tuple[str, int | None]:
    ws = await open_ws(url, **kwargs)
    err = await recv_event(ws)
    with pytest.raises(Exception):  # noqa: B017 - the server closes the socket
        await recv_event(ws, timeout=5)
    return err["error"]["code"], ws.close_code


async def test_resume_rotates_a_signed_token_of_this_replica(server: ServerProc) -> None:
    ws, resume = await start_session(server.ws_url)
    token = resume["resume_token"]
    assert token_replica(token) == "alpha" and ResumeTokens("alpha", SECRET).check(token) is TokenCheck.OURS
    ws.transport.abort()  # dropped, not closed: the session waits for its resume
    await asyncio.sleep(0.3)  # until the server has seen the drop
    ws2 = await open_ws(server.ws_url, additional_headers={"X-Duplex-Resume-Token": token})
    assert (await recv_event(ws2))["session"]["id"] == resume["session_id"]
    again = await recv_event(ws2)
    assert again["resumed"] is True and again["resume_token"] != token
    assert token_replica(again["resume_token"]) == "alpha"
    await ws2.close()


async def test_a_resume_takes_over_a_session_whose_old_connection_is_still_open(server: ServerProc) -> None:
    """The client comes back before the server saw its old connection end (a network that drops without
    a FIN): the token proves it got that connection's greeting, so the new connection gets the session
    and the old one is hung up on with 4409, not a goodbye."""
    old, resume = await start_session(server.ws_url)
    await old.send(pcm16(random_pcm(TICK, seed=3)))
    before = await collect_audio(old, 1)  # the old connection is live and stepping
    new = await open_ws(server.ws_url, additional_headers={"X-Duplex-Resume-Token": resume["resume_token"]})
    created, again = await recv_event(new), await recv_event(new)
    assert created["session"]["id"] == resume["session_id"] and again["resumed"] is True, (created, again)
    with pytest.raises(ConnectionClosed):
        while True:
            await recv_event(old, timeout=5)
    assert old.close_code == 4409 and "another connection" in (old.close_reason or ""), old.close_reason
    # The old token is spent, the new connection is the session's: it streams on.
    code, close = await _refused(server.ws_url, additional_headers={"X-Duplex-Resume-Token": resume["resume_token"]})
    assert (code, close) == ("invalid_resume_token", 1008)
    await new.send(pcm16(random_pcm(TICK, seed=4)))
    after = await collect_audio(new, 1)
    assert min(after) > max(before), (before.keys(), after.keys())  # the same session's clock, on
    metrics = httpx.get(server.url + "/metrics").text
    assert "duplex_sessions_taken_over_total 1.0" in metrics
    await new.close()


async def test_forged_and_foreign_tokens_get_a_4xx_not_a_session(server: ServerProc) -> None:
    before = httpx.get(server.url + "/healthz").json()["sessions"]
    ws, resume = await start_session(server.ws_url)
    token = resume["resume_token"]
    ws.transport.abort()
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    foreign = ResumeTokens("beta", SECRET).mint()
    for bad in (forged, "alpha.guess", foreign):
        code, close = await _refused(server.ws_url, additional_headers={"X-Duplex-Resume-Token": bad})
        assert (code, close) == ("invalid_resume_token", 1008), bad
    code, close = await _refused(server.ws_url, subprotocols=["realtime", "duplex-resume-token." + forged])
    assert (code, close) == ("invalid_resume_token", 1008)
    # The same over HTTP (a WebRTC offer that resumes): 403 forged, 421 another replica's.
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post("/v1/realtime/calls", content="v=0\r\n",
                            headers={"Content-Type": "application/sdp", "X-Duplex-Resume-Token": forged})
        if r.status_code != 404:  # 404: WebRTC is not installed here
            assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_resume_token"
            r = await http.post("/v1/realtime/calls", content="v=0\r\n",
                                headers={"Content-Type": "application/sdp", "X-Duplex-Resume-Token": foreign})
            assert r.status_code == 421
    # None of it opened a session, and the genuine token still resumes.
    assert httpx.get(server.url + "/healthz").json()["sessions"] == before + 1
    ws2 = await open_ws(server.ws_url, additional_headers={"X-Duplex-Resume-Token": token})
    assert (await recv_event(ws2))["session"]["id"] == resume["session_id"]
    await ws2.close()
