"""The per-session background worker, in process, against the real openai backend and a scripted
OpenAI-compatible server on loopback: epochs, policies, stale chunks, failures, tools."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np
import pytest

from models.background.openai_backend import OpenAIConfig, OpenAIReasoner
from models.base import BackgroundChunk, Event, InteractionModel, TickOutput, silence
from models.echo import EchoModel
from server.background import BackgroundSettings, BackgroundWorker, Policy
from server.engine import Engine
from server.metrics import Metrics
from server.sessions import Pace, Session
from streaming.types import TICK_SAMPLES
from tests.server._background_stub import ScriptedOpenAI
from tests.server._event_sink import EventSink


@pytest.fixture(scope="module")
def stub() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    yield server
    server.stop()


def make_worker(stub: ScriptedOpenAI, read_timeout: float = 5.0,
                **settings: Any) -> tuple[BackgroundWorker, EventSink, OpenAIReasoner]:
    session = Session(id="sess_test", resume_token="tok", state=None)
    sink = EventSink()
    session.sink = sink
    reasoner = OpenAIReasoner(OpenAIConfig(base_url=stub.base_url, model="scripted",
                                           read_timeout=read_timeout, retries=0))
    worker = BackgroundWorker(session, reasoner, BackgroundSettings(**settings), Metrics())
    session.background = worker
    return worker, sink, reasoner


def ended(worker: BackgroundWorker, status: str) -> float | None:
    """The server metric of requests that ended with `status`."""
    assert worker.metrics is not None
    return worker.metrics.registry.get_sample_value("duplex_background_requests_total", {"status": status})


async def until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def drain_later(worker: BackgroundWorker, ticks: int = 100) -> list[BackgroundChunk]:
    """The foreground's drain after it stepped `ticks` more micro-turns: chunks are delivered at the
    micro-turn their virtual-clock stamp says (models/background/clock.py), not before."""
    worker.session.tick += ticks
    return worker.drain()


async def drain_until_done(worker: BackgroundWorker, request_id: str,
                           timeout: float = 10.0) -> list[BackgroundChunk]:
    """Drain every 20 ms, one micro-turn on each time (a fast foreground), until `request_id`
    delivers its done chunk."""
    got: list[BackgroundChunk] = []
    deadline = time.monotonic() + timeout
    while not any(c.request_id == request_id and c.done for c in got):
        assert time.monotonic() < deadline, f"no done chunk for {request_id}; got {got}"
        await asyncio.sleep(0.02)
        got += drain_later(worker, 1)
    return got


def text_of(chunks: list[BackgroundChunk], request_id: str) -> str:
    return "".join(c.text for c in chunks if c.request_id == request_id)


async def test_answer_streams_to_drain_and_client(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub)
    worker.session.log.add(0.4, "user", "hello there")
    worker.session.settings.instructions = "Be terse."
    rid = worker.request("what is up", source="client")
    assert rid is not None
    chunks = await drain_until_done(worker, rid)
    assert text_of(chunks, rid) == "answer: what is up"
    assert chunks[-1].done and chunks[-1].error is None and chunks[-1].epoch == 1
    assert "".join(e["delta"] for e in sink.of("duplex.background.delta")) == "answer: what is up"
    assert sink.of("duplex.background.done")[0]["text"] == "answer: what is up"
    # The context carried the instructions, the transcript, and the task.
    sent = stub.requests[-1]["messages"]
    assert "Be terse." in sent[0]["content"]
    assert "User: hello there" in sent[1]["content"]
    assert sent[1]["content"].endswith("Task: what is up")
    assert worker.session.log.entries[-1].role == "background"
    # The next request's context is the previous one plus new turns (so a prefix cache covers it all),
    # with only what was said since.
    worker.session.log.entries[0].text += " and more"  # a speech entry still growing
    worker.session.log.add(1.0, "assistant", "sure")
    rid2 = worker.request("and now?", source="client")
    assert rid2 is not None
    await drain_until_done(worker, rid2)
    again = stub.requests[-1]["messages"]
    assert again[:2] == sent[:2] and again[2] == {"role": "assistant", "content": "answer: what is up"}
    assert again[3]["content"] == "Conversation so far:\nUser: and more\nAssistant: sure\n\nTask: and now?"
    await worker.stop()
    await reasoner.aclose()


async def test_delegate_event_from_the_foreground_starts_a_request(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub)
    worker.on_output(TickOutput(silence(), events=[Event("delegate", {"query": "look it up", "ask": 7})]), tick=3)
    worker.on_output(TickOutput(silence(), events=[Event("delegate", {})]), tick=4)  # no query: ignored
    await until(lambda: bool(sink.of("duplex.background.done")))
    started = sink.of("duplex.background.started")
    assert len(started) == 1 and started[0]["source"] == "model" and started[0]["query"] == "look it up"
    chunks = drain_later(worker)
    assert text_of(chunks, started[0]["request_id"]) == "answer: look it up"
    assert chunks and all(c.ask == 7 for c in chunks)  # the foreground's number for its question, given back
    await worker.stop()
    await reasoner.aclose()


async def test_supersede_cancels_the_old_request_and_its_chunks_never_reach_the_foreground(
        stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub)
    old = worker.request("[slow] first", source="client")
    assert old is not None
    await until(lambda: len(sink.of("duplex.background.delta")) >= 2)
    before = drain_later(worker)  # the foreground took some of the old answer already: that is fine
    assert before and all(c.request_id == old for c in before)
    await until(lambda: len(sink.of("duplex.background.delta")) >= 4)  # more old text waits in drain()
    new = worker.request("second", source="client")
    assert new is not None
    after = await drain_until_done(worker, new)
    await asyncio.sleep(0.3)  # the old stream would have produced more by now
    after += drain_later(worker)
    assert {c.request_id for c in after} == {new}, "a superseded request leaked into TickInput.background"
    assert all(c.epoch == 2 for c in after)
    cancelled = [e for e in sink.of("duplex.background.done") if e["request_id"] == old]
    assert cancelled and cancelled[0]["status"] == "cancelled" and cancelled[0]["reason"] == "superseded"
    old_deltas = [e for e in sink.of("duplex.background.delta") if e["request_id"] == old]
    assert len(old_deltas) < 10, "the old stream was not stopped"
    assert ended(worker, "cancelled") == 1 and ended(worker, "completed") == 1
    assert worker.metrics is not None
    assert worker.metrics.registry.get_sample_value("duplex_background_first_text_seconds_count") == 2
    await worker.stop()
    assert ended(worker, "cancelled") == 1  # nothing was running any more
    await reasoner.aclose()


async def test_queue_policy_answers_in_order_without_interleaving(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub, policy=Policy.QUEUE)
    first = worker.request("[slow] one", source="client")
    second = worker.request("two", source="client")
    assert first and second
    started = sink.of("duplex.background.started")
    assert [s["queued"] for s in started] == [False, True]
    chunks = await drain_until_done(worker, second)
    order = [c.request_id for c in chunks]
    assert order.index(second) > max(i for i, r in enumerate(order) if r == first), "answers interleaved"
    assert text_of(chunks, first) == " ".join(f"slow{i}" for i in range(10))
    assert text_of(chunks, second) == "answer: two"
    assert [e["status"] for e in sink.of("duplex.background.done")] == ["completed", "completed"]
    await worker.stop()
    await reasoner.aclose()


async def test_a_superseded_runner_does_not_let_a_queued_request_run_alongside(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub)
    assert worker.request("[slow] a", source="client")
    await until(lambda: len(sink.of("duplex.background.delta")) >= 1)
    b = worker.request("[slow] b", source="client")
    await asyncio.sleep(0.1)  # the cancelled runner for "a" unwinds now
    c = worker.request("c", source="client", policy=Policy.QUEUE)
    assert b and c
    assert sink.of("duplex.background.started")[-1]["queued"] is True
    chunks = await drain_until_done(worker, c)
    order = [x.request_id for x in chunks]
    assert order.index(c) > max(i for i, r in enumerate(order) if r == b), "b and c ran at the same time"
    await worker.stop()
    await reasoner.aclose()


async def test_queue_is_bounded(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub, policy=Policy.QUEUE, max_queue=1)
    assert worker.request("[slow] a", source="client")
    assert worker.request("b", source="client")  # waits
    assert worker.request("c", source="client") is None
    assert sink.of("duplex.background.error")[-1]["error"]["code"] == "queue_full"
    await worker.stop()
    await reasoner.aclose()


@pytest.mark.parametrize(("marker", "code"), [("[hang]", "timeout"), ("[drop]", "dropped"),
                                              ("[malformed]", "malformed")])
async def test_reasoner_failure_is_an_error_event_and_chunk_and_the_session_goes_on(
        stub: ScriptedOpenAI, marker: str, code: str) -> None:
    worker, sink, reasoner = make_worker(stub, read_timeout=0.5)
    bad = worker.request(f"{marker} please", source="client")
    assert bad is not None
    chunks = await drain_until_done(worker, bad)
    assert chunks[-1].error and chunks[-1].done
    err = sink.of("duplex.background.error")[-1]
    assert err["request_id"] == bad and err["error"]["code"] == code, err
    assert err["error"]["message"] == chunks[-1].error
    good = worker.request("still there?", source="client")
    assert good is not None
    assert text_of(await drain_until_done(worker, good), good) == "answer: still there?"
    assert ended(worker, code) == 1 and ended(worker, "completed") == 1
    await worker.stop()
    await reasoner.aclose()


async def test_request_timeout_covers_the_whole_request(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub, request_timeout=0.3)
    rid = worker.request("[slow] long", source="client")
    assert rid is not None
    late = worker.request("[slow] queued behind it", source="client", policy=Policy.QUEUE)
    assert late is not None
    chunks = [c for c in await drain_until_done(worker, rid) if c.request_id == rid]
    assert chunks[-1].error and "longer than 0.3 s" in chunks[-1].error
    assert sink.of("duplex.background.error")[-1]["error"]["code"] == "timeout"
    await worker.stop()  # the queued request runs now: the session's end cancels it
    # Each request is counted once, however it ended (on a stalled machine the second may have
    # timed out too before the stop).
    assert ended(worker, "timeout") in (1, 2)
    assert (ended(worker, "timeout") or 0) + (ended(worker, "cancelled") or 0) == 2
    await reasoner.aclose()


async def test_builtin_tool_runs_and_its_result_goes_back_to_the_reasoner(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub)
    rid = worker.request('[tool:calculate:{"expression": "17 * 23 + 1"}] sum?', source="client")
    assert rid is not None
    chunks = await drain_until_done(worker, rid)
    assert text_of(chunks, rid) == 'tool said: {"result": 392}'
    offered = {t["function"]["name"] for t in stub.requests[-2]["tools"]}
    assert {"calculate", "get_current_time"} <= offered
    tool_msgs = [m for m in stub.requests[-1]["messages"] if m["role"] == "tool"]
    assert tool_msgs == [{"role": "tool", "tool_call_id": "call_model_1", "content": '{"result": 392}'}]
    assert sink.of("duplex.background.tool")[0]["ok"] is True
    await worker.stop()
    await reasoner.aclose()


async def test_a_failing_tool_returns_an_error_result_and_the_answer_goes_on(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub)
    rid = worker.request('[tool:calculate:{"expression": "__import__(1)"}] hack', source="client")
    assert rid is not None
    chunks = await drain_until_done(worker, rid)
    assert "tool said:" in text_of(chunks, rid) and "unsupported element" in text_of(chunks, rid)
    assert chunks[-1].error is None
    assert sink.of("duplex.background.tool")[0]["ok"] is False
    await worker.stop()
    await reasoner.aclose()


async def test_client_tool_that_never_answers_times_out_into_an_error_result(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub, tool_timeout=0.3)
    worker.session.settings.tools = [{"type": "function", "name": "open_door", "parameters": {"type": "object"}}]
    rid = worker.request('[tool:open_door:{"door": 1}] open it', source="client")
    assert rid is not None
    chunks = await drain_until_done(worker, rid)
    call = sink.of("response.function_call_arguments.done")[0]
    assert call["name"] == "open_door" and json.loads(call["arguments"]) == {"door": 1}
    assert "did not return a function_call_output" in text_of(chunks, rid)
    # A late answer is refused with an error naming the call, not silently used.
    assert worker.on_client_event({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": "{}"}})
    assert sink.of("error")[-1]["error"]["code"] == "unknown_call_id"
    await worker.stop()
    await reasoner.aclose()


async def test_invalid_client_requests_get_error_events(stub: ScriptedOpenAI) -> None:
    worker, sink, reasoner = make_worker(stub)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"query": ""}, "invalid_query"), ({"query": 3}, "invalid_query"),
        ({"query": "x" * 5000}, "query_too_long"), ({"query": "hi", "policy": "later"}, "invalid_policy")]
    for ev, code in cases:
        assert worker.on_client_event({"type": "duplex.background.request", "event_id": "ev1", **ev})
        err = sink.of("error")[-1]["error"]
        assert err["code"] == code and err["event_id"] == "ev1"
    assert worker.on_client_event({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": 5}})
    assert sink.of("error")[-1]["error"]["code"] == "invalid_function_call_output"
    assert not sink.of("duplex.background.started")
    await worker.stop()
    await reasoner.aclose()


class RecordingEcho(EchoModel):
    """The echo model, keeping what each micro-turn's TickInput.background held."""

    def __init__(self) -> None:
        super().__init__(delay=0)
        self.background: list[BackgroundChunk] = []

    def step(self, batch: Any) -> list[TickOutput]:
        for _, tick in batch:
            self.background.extend(tick.background)
        return super().step(batch)


async def test_engine_feeds_only_live_chunks_into_the_models_tick_input(stub: ScriptedOpenAI) -> None:
    """Through the real engine: what the foreground model receives, with a supersede in the middle."""
    model = RecordingEcho()
    engine = Engine(cast(InteractionModel, model), Metrics())
    await engine.start()
    worker, sink, reasoner = make_worker(stub)
    session = worker.session
    session.state = await engine.open_state(session.id)
    session.settings.pace = Pace.MEDIA
    engine.add(session)
    tick = np.zeros(TICK_SAMPLES, dtype=np.float32)

    async def step_until(pred: Callable[[], bool]) -> None:
        for _ in range(300):  # bounded: 300 micro-turns
            await engine.push_audio_media(session, tick)
            await until(lambda: session.sched.in_flight == 0 and session.inbox.ready() == 0)
            if pred():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not met within 300 micro-turns")

    old = worker.request("[slow] old", source="client")
    await step_until(lambda: any(c.request_id == old for c in model.background))  # old text reached the model
    await until(lambda: len(sink.of("duplex.background.delta")) >= 5)  # and more of it waits in drain()
    seen_before = len(model.background)
    new = worker.request("new", source="client")
    assert old is not None and new is not None
    await step_until(lambda: any(c.request_id == new and c.done for c in model.background))
    after = model.background[seen_before:]
    assert {c.request_id for c in after} == {new}, f"stale chunks reached the model: {after}"
    assert text_of(after, new) == "answer: new"
    engine.remove(session)
    await worker.stop()
    await engine.stop()
    await reasoner.aclose()
