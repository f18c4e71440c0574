"""The openai backend against a scripted OpenAI-compatible server on loopback: deltas, tool-call
fragments, and each failure mapped to a ReasonerError that says what to do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from models.background import Done, ReasonerError, TextDelta, ToolCall
from models.background.base import Delta
from models.background.openai_backend import OpenAIConfig, OpenAIReasoner
from tests.conftest import free_port
from tests.server._background_stub import ScriptedOpenAI


@pytest.fixture(scope="module")
def stub() -> Iterator[ScriptedOpenAI]:
    server = ScriptedOpenAI().start()
    yield server
    server.stop()


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def collect(r: OpenAIReasoner, text: str) -> list[Delta]:
    try:
        return [d async for d in r.stream(ask(text), [])]
    finally:
        await r.aclose()


async def test_text_then_done(stub: ScriptedOpenAI) -> None:
    r = OpenAIReasoner(OpenAIConfig(base_url=stub.base_url, model="m"))
    deltas = await collect(r, "hello world")
    assert deltas == [TextDelta("answer:"), TextDelta(" hello"), TextDelta(" world"), Done("stop", 0)]
    assert stub.requests[-1]["model"] == "m" and stub.requests[-1]["stream"] is True


async def test_tool_call_fragments_are_joined(stub: ScriptedOpenAI) -> None:
    r = OpenAIReasoner(OpenAIConfig(base_url=stub.base_url))
    deltas = await collect(r, '[tool:calculate:{"expression": "1+1"}]')
    assert deltas == [ToolCall("call_model_1", "calculate", '{"expression": "1+1"}'), Done("tool_calls", 0)]


async def test_stall_is_a_timeout_and_is_retried_while_nothing_was_streamed(stub: ScriptedOpenAI) -> None:
    before = len(stub.requests)
    r = OpenAIReasoner(OpenAIConfig(base_url=stub.base_url, read_timeout=0.3, retries=1, backoff=0.01))
    with pytest.raises(ReasonerError) as err:
        await collect(r, "[hang]")
    assert err.value.code == "timeout" and "0.3 s" in err.value.message
    assert len(stub.requests) - before == 2, "one retry expected"


async def test_drop_after_text_is_not_retried(stub: ScriptedOpenAI) -> None:
    before = len(stub.requests)
    r = OpenAIReasoner(OpenAIConfig(base_url=stub.base_url, retries=2, backoff=0.01))
    seen: list[Delta] = []
    with pytest.raises(ReasonerError) as err:
        async for d in r.stream(ask("[drop]"), []):
            seen.append(d)
    await r.aclose()
    assert seen == [TextDelta("cut"), TextDelta(" here")]
    assert err.value.code == "dropped" and "mid-answer" in err.value.message
    assert len(stub.requests) - before == 1, "a retry would repeat text already delivered"


async def test_malformed_chunk(stub: ScriptedOpenAI) -> None:
    r = OpenAIReasoner(OpenAIConfig(base_url=stub.base_url, retries=0))
    with pytest.raises(ReasonerError) as err:
        await collect(r, "[malformed]")
    assert err.value.code == "malformed" and "OpenAI-compatible" in err.value.message


async def test_unreachable_server_names_the_url_and_the_flag() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    r = OpenAIReasoner(OpenAIConfig(base_url=url, retries=1, backoff=0.01, connect_timeout=1.0))
    with pytest.raises(ReasonerError) as err:
        await collect(r, "hi")
    assert err.value.code == "unreachable" and url in err.value.message and "--background-url" in err.value.message
