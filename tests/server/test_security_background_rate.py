"""A client asking the shared background reasoner as fast as it can: a few requests back to back are
served, the rest are refused with `rate_limited` until the session's bucket refills; on a real server
whose reasoner is a scripted OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from server.rate_limit import BACKGROUND_BURST
from tests.server._background_stub import ScriptedOpenAI
from tests.wsclient import recv_event, send, start_session


@pytest.fixture
def stub() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    yield server
    server.stop()


async def test_background_requests_beyond_the_burst_are_rate_limited(duplex_server, stub: ScriptedOpenAI) -> None:
    server = duplex_server("--model", "echo", "--background", "openai", "--background-url", stub.base_url,
                           "--background-model", "scripted")
    ws, _ = await start_session(server.ws_url, pace="media")
    sent = BACKGROUND_BURST + 3
    for i in range(sent):
        await send(ws, {"type": "duplex.background.request", "event_id": f"q{i}", "query": f"[slow] question {i}"})
    started: list[str] = []
    limited: list[str] = []
    while len(started) + len(limited) < sent:
        ev = await recv_event(ws)
        if ev["type"] == "duplex.background.started":
            started.append(ev["client_event_id"])
        elif ev["type"] == "error" and ev["error"]["code"] == "rate_limited":
            limited.append(ev["error"]["event_id"])
            assert "background requests" in ev["error"]["message"]
    assert started == [f"q{i}" for i in range(BACKGROUND_BURST)]
    assert limited == [f"q{i}" for i in range(BACKGROUND_BURST, sent)]
    await send(ws, {"type": "session.update", "session": {"instructions": "still here"}})  # the session goes on
    while (ev := await recv_event(ws))["type"] != "session.updated":
        pass
    await ws.close()
    assert len(stub.requests) <= BACKGROUND_BURST  # the refused ones never reached the reasoner


async def test_a_session_queueing_requests_does_not_keep_another_from_the_shared_reasoner(
        duplex_server, stub: ScriptedOpenAI) -> None:
    """Fair use of the one reasoner every session shares: a session has one request at the reasoner at a
    time (the rest wait in its own queue), so another session's question goes ahead of the queue."""
    server = duplex_server("--model", "echo", "--background", "openai", "--background-url", stub.base_url,
                           "--background-model", "scripted")
    greedy, _ = await start_session(server.ws_url, pace="media")
    other, _ = await start_session(server.ws_url, pace="media")
    for i in range(BACKGROUND_BURST):
        await send(greedy, {"type": "duplex.background.request", "event_id": f"g{i}", "policy": "queue",
                            "query": f"[slow] greedy {i}"})
    while (await recv_event(greedy))["type"] != "duplex.background.started":
        pass
    await send(other, {"type": "duplex.background.request", "event_id": "o", "query": "[slow] other"})
    done = 0
    while done < BACKGROUND_BURST:  # every queued request is answered in turn
        done += (await recv_event(greedy, timeout=20))["type"] == "duplex.background.done"
    while (await recv_event(other, timeout=20))["type"] != "duplex.background.done":
        pass
    asked = [m["content"] for body in stub.requests for m in body["messages"][-1:]]
    order = [next(q for q in ("greedy 0", "greedy 1", "greedy 2", "other") if q in text) for text in asked]
    # Had the session's requests all gone to the reasoner at once, "other" would come last. It comes
    # first or second (greedy 0 may reach the stub after it on a loaded machine: `started` is sent when
    # the request is taken, before its HTTP call); the 1 s of greedy 0 and of greedy 1 is the margin.
    assert order.index("other") < order.index("greedy 2"), asked
    assert [q for q in order if q != "other"] == ["greedy 0", "greedy 1", "greedy 2"], asked
    assert sorted(order) == ["greedy 0", "greedy 1", "greedy 2", "other"], asked
    await greedy.close()
    await other.close()
