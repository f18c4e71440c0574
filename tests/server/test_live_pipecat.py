"""pipecat's unmodified `OpenAILiveLLMService` pointed at `/v1/live/sessions`, in the smallest pipeline
pipecat runs without a device: frames queued in, frames collected out. The server runs echo:0, so what
comes back is what went in: the handshake, the audio both ways and the close work with pipecat's client.
Skipped where pipecat-ai is not installed (it is not a dependency of duplex)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.conftest import ServerProc, start_server

pytest.importorskip("pipecat.services.openai.live", reason="pipecat-ai is not installed")

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InputAudioRawFrame,
    LLMContextFrame,
    OutputAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineTask
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.live.llm import OpenAILiveLLMService


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--max-sessions", "2", tmp_path=tmp_path_factory.mktemp("pipecat"))
    yield srv
    srv.stop()


class Collect(FrameProcessor):
    """The pipeline's end: keeps the output audio the service pushes downstream."""

    def __init__(self) -> None:
        super().__init__()
        self.audio: list[bytes] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputAudioRawFrame):
            self.audio.append(frame.audio)
        await self.push_frame(frame, direction)


async def test_pipecat_live_service_streams_through_duplex(echo: ServerProc) -> None:
    llm = OpenAILiveLLMService(api_key="unused", base_url=f"ws://{echo.host}:{echo.port}/v1/live/sessions")
    started: list[object] = []

    @llm.event_handler("on_session_started")
    async def on_started(service: object, session: object) -> None:
        started.append(session)

    out = Collect()
    task = PipelineTask(Pipeline([llm, out]))
    runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
    await task.queue_frame(LLMContextFrame(LLMContext(messages=[{"role": "system", "content": "Be brief."}])))
    deadline = time.monotonic() + 20
    while not started:
        assert time.monotonic() < deadline, "no session.started"
        await asyncio.sleep(0.05)
    t = np.arange(24000) / 24000
    tone = (np.sin(2 * np.pi * 440 * t) * 0.3 * 32767).astype("<i2").tobytes()
    for k in range(0, len(tone), 9600):  # 1 s in micro-turns, at real time
        await task.queue_frame(InputAudioRawFrame(audio=tone[k : k + 9600], sample_rate=24000, num_channels=1))
        await asyncio.sleep(0.2)
    while not any(np.any(np.frombuffer(a, "<i2")) for a in out.audio):
        assert time.monotonic() < deadline + 10, f"no audio back ({len(out.audio)} silent frames)"
        await asyncio.sleep(0.05)
    await task.queue_frame(EndFrame())
    await asyncio.wait_for(runner, 20)
    loud = b"".join(a for a in out.audio if np.any(np.frombuffer(a, "<i2")))
    assert len(loud) >= len(tone) // 2, "the tone came back through pipecat"
