"""The OpenAI Agents SDK's realtime runner, unmodified, on `/v1/realtime` with only its URL changed: a
real server (echo:0, whose answer is the input played back), the framework's own session events."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ServerProc, start_server
from tests.wsclient import TICK, pcm16, random_pcm

agents_realtime = pytest.importorskip("agents.realtime", reason="openai-agents (the dev extra) is not installed")


@pytest.fixture(scope="module")
def echo0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", tmp_path=tmp_path_factory.mktemp("agents"))
    yield srv
    srv.stop()


async def test_the_agents_sdk_hears_the_answer_and_mirrors_the_conversation(echo0: ServerProc) -> None:
    agent = agents_realtime.RealtimeAgent(name="echo", instructions="Repeat what you hear.")
    runner = agents_realtime.RealtimeRunner(agent)
    session = await runner.run(model_config={"url": echo0.ws_url, "api_key": "unused"})
    sent = b"".join(pcm16(random_pcm(TICK, seed=i)) for i in range(5))
    heard = bytearray()
    errors: list[Any] = []
    ended = asyncio.Event()
    history: list[Any] = []

    async def listen() -> None:
        async for event in session:
            if event.type == "audio":
                heard.extend(event.audio.data)
            elif event.type == "error":
                errors.append(event.error)
            elif event.type == "history_updated":
                history[:] = event.history
            elif event.type == "agent_end":
                ended.set()

    async with session:
        listener = asyncio.create_task(listen())
        for i in range(0, len(sent), 2 * TICK):
            await session.send_audio(sent[i:i + 2 * TICK])
            await asyncio.sleep(0.2)
        for _ in range(10):  # silence: the echo stops and the response is done
            await session.send_audio(bytes(2 * TICK))
            await asyncio.sleep(0.2)
        await asyncio.wait_for(ended.wait(), 10)
        listener.cancel()
    assert not errors, errors[:3]
    assert len(heard) >= 0.95 * len(sent), (len(heard), len(sent))  # the answer's audio reached the app
    assistant = [item for item in history if getattr(item, "role", None) == "assistant"]
    assert assistant and assistant[-1].status == "completed", history
