"""Delegation through `/v1/live/sessions`, driven by the unmodified `openai` SDK, with the cascade voice
on a real server: a spoken look-up under client delegation answered by the app's commentary, which is
then heard; and under Responses delegation, the server's background reasoner (a scripted
OpenAI-compatible server standing in for `--background`) calling a client function tool, whose output
the app returns with `response.item.create` + `response.create`, and whose answer is spoken.

Sessions run in media pace (duplex's `session.duplex.pace` extension): each micro-turn is stepped when
its audio has arrived, so the client feeds the microphone a micro-turn at a time and reads that
micro-turn's output before the next, independent of how busy the machine is.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from openai import AsyncOpenAI

from models.speech.tts import synthesize
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SAMPLES
from tests.conftest import ServerProc, start_server
from tests.server._background_stub import ScriptedOpenAI

pytest.importorskip("openai.resources.live", reason="this openai SDK has no client.live (openai>=3.51 has)")

pytestmark = pytest.mark.timeout(900)  # the cascade's start-up and two spoken turns on two shared cores
TOOL_CALL = '[tool:get_weather:{"city": "Paris"}]'  # the scripted reasoner calls the tool where it reads this


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    stub = ScriptedOpenAI().start()
    srv = start_server("--model", "cascade", "--background", "openai", "--background-url", stub.base_url,
                       "--max-sessions", "2", tmp_path=tmp_path_factory.mktemp("live-cascade"),
                       ready_timeout=600.0)  # the cascade loads Whisper, Piper and its probes
    yield srv
    srv.stop()
    stub.stop()


def speech(text: str) -> np.ndarray:
    audio, sr = synthesize(text)
    return resample(audio, sr, SAMPLE_RATE)


def pcm(audio: np.ndarray) -> str:
    ints = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    return base64.b64encode(ints.tobytes()).decode("ascii")


class Mic:
    """Feeds a media-pace session one micro-turn at a time and keeps every event in arrival order."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.events: list[Any] = []
        self.audio: list[np.ndarray] = []  # output, one entry per micro-turn

    async def step(self, chunk: np.ndarray, on_event: Callable[[Any], Any] | None = None) -> None:
        tick = np.zeros(TICK_SAMPLES, dtype=np.float32)
        tick[: len(chunk)] = chunk[:TICK_SAMPLES]
        await self.conn.session.input_audio.append(audio=pcm(tick))
        while True:
            ev = await asyncio.wait_for(self.conn.recv(), 30)
            assert ev.type != "error", ev
            self.events.append(ev)
            if on_event is not None:
                await on_event(ev)
            if ev.type == "session.output_audio.delta":
                self.audio.append(np.frombuffer(base64.b64decode(ev.delta), "<i2").astype(np.float32) / 32768)
                return

    async def feed(self, audio: np.ndarray, on_event: Callable[[Any], Any] | None = None) -> None:
        for i in range(0, len(audio), TICK_SAMPLES):
            await self.step(audio[i : i + TICK_SAMPLES], on_event)

    async def wait(self, done: Callable[[], bool], on_event: Callable[[Any], Any] | None = None,
                   seconds: float = 60.0) -> None:
        """Silence, at most 4x faster than real time (the reasoner and the voice share two cores), until `done`."""
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline, [e.type for e in self.events[-20:]]
            t = time.monotonic()
            await self.step(np.zeros(TICK_SAMPLES, np.float32), on_event)
            await asyncio.sleep(max(0.0, 0.05 - (time.monotonic() - t)))

    def of(self, etype: str) -> list[Any]:
        return [e for e in self.events if e.type == etype]

    def said(self) -> str:
        return "".join(e.delta for e in self.of("session.output_transcript.delta"))


async def test_client_delegation_is_answered_by_the_apps_commentary(cascade: ServerProc) -> None:
    client = AsyncOpenAI(api_key="unused", base_url=f"{cascade.url}/v1")
    async with client.live.connect(max_retries=0) as conn:
        await conn.session.start(session={"model": "gpt-live-1", "delegation": {"type": "client"},
                                          "duplex": {"pace": "media"}})
        assert (await asyncio.wait_for(conn.recv(), 30)).type == "session.started"
        mic = Mic(conn)
        answer = "The weather in Paris is sunny and warm today."

        async def app(ev: Any) -> None:  # the app's backend: answer every hand-off with spoken context
            if ev.type == "session.delegation.created":
                await conn.session.commentary.append(content=answer, delegation_id=ev.delegation.id)

        await mic.feed(np.concatenate([np.zeros(SAMPLE_RATE // 2, np.float32),
                                       speech("Can you look up the weather in Paris for me?"),
                                       np.zeros(SAMPLE_RATE, np.float32)]), app)
        await mic.wait(lambda: "sunny" in mic.said().lower(), app)
        # Transcripts first: the user's words reach the app before the hand-off they explain.
        order = [e.type for e in mic.events]
        heard = "".join(e.delta for e in mic.of("session.input_transcript.delta"))
        assert "look up the weather" in heard.lower(), heard
        created = mic.of("session.delegation.created")
        assert created and created[0].delegation.target == "client" and created[0].delegation.id
        assert order.index("session.input_transcript.delta") < order.index("session.delegation.created")
        ack = mic.of("session.commentary.appended")[0]
        assert ack.start_ms >= created[0].offset_ms
        # The commentary is heard: its words are said, with loud audio, after it was placed.
        sunny = next(e for e in mic.of("session.output_transcript.delta") if "sunny" in e.delta.lower())
        assert sunny.start_ms >= ack.start_ms
        tick = sunny.start_ms // 200
        assert any(np.abs(a).max() > 1e-2 for a in mic.audio[max(0, tick - 5) : tick + 10])
        # Stamps are on the micro-turn clock and never go back.
        for kind in ("session.input_transcript.delta", "session.output_transcript.delta"):
            stamps = [(e.start_ms, e.end_ms) for e in mic.of(kind)]
            assert all(s < e for s, e in stamps) and stamps == sorted(stamps), (kind, stamps)
            assert all(e <= 200 * len(mic.audio) for _, e in stamps)
        await conn.session.close()
        while (ev := await asyncio.wait_for(conn.recv(), 5)).type != "session.closed":
            pass
        assert ev.reason == "close_requested"


async def test_real_time_speech_gives_ordered_events_and_a_continuous_track(cascade: ServerProc) -> None:
    """The SDK's own example, at real time: speech in 20 ms appends paced by the wall clock, then silence."""
    client = AsyncOpenAI(api_key="unused", base_url=f"{cascade.url}/v1")
    async with client.live.connect(max_retries=0) as conn:
        await conn.session.start(session={"model": "gpt-live-1", "instructions": "Be brief."})
        first = await asyncio.wait_for(conn.recv(), 30)
        assert first.type == "session.started"
        mic = np.concatenate([speech("Can you look up the weather in Paris for me?"),
                              np.zeros(4 * SAMPLE_RATE, np.float32)])
        events: list[Any] = []

        async def receive() -> None:
            async for ev in conn:
                events.append(ev)
                if ev.type == "session.delegation.created":
                    await conn.session.commentary.append(content="It is sunny.", delegation_id=ev.delegation.id)
                if ev.type == "session.closed":
                    return

        reader = asyncio.create_task(receive())
        step = SAMPLE_RATE // 50  # 20 ms
        begun = time.monotonic()
        k = 0

        def answered() -> bool:  # the app's commentary, if a hand-off asked for one, is on the timeline
            kinds = [e.type for e in events]
            return "session.delegation.created" not in kinds or "session.commentary.appended" in kinds

        # The microphone, then silence until the app's answer is placed (it is placed on a micro-turn).
        while k * step < len(mic) or (not answered() and k * step < len(mic) + 10 * SAMPLE_RATE):
            chunk = mic[k * step : (k + 1) * step] if k * step < len(mic) else np.zeros(step, np.float32)
            await conn.session.input_audio.append(audio=pcm(chunk))
            k += 1
            await asyncio.sleep(max(0.0, begun + k * 0.02 - time.monotonic()))
        sent, elapsed = k * step, time.monotonic() - begun
        await conn.session.close()
        await asyncio.wait_for(reader, 10)
        kinds = [e.type for e in events]
        assert kinds[-1] == "session.closed" and events[-1].reason == "close_requested"
        # No command of the client's was refused (a loaded machine may add server_error reports).
        refused = [e for e in events if e.type == "error" and e.error.type == "invalid_request_error"]
        assert not refused, refused
        # One delta a micro-turn for the whole stream, silence included: at least one per micro-turn of
        # input; more where input came late (the gap is a micro-turn of silence, and the engine then catches
        # up with what arrived), so only bounded loosely above.
        deltas = kinds.count("session.output_audio.delta")
        assert sent / TICK_SAMPLES - 3 <= deltas <= 2 * sent / TICK_SAMPLES, (deltas, sent / TICK_SAMPLES, elapsed)
        # What it heard is not checked here: a loaded machine's real time cuts the words up (or loses them);
        # the media-pace tests check them. Whatever was transcribed has its stamps in order.
        for kind in ("session.input_transcript.delta", "session.output_transcript.delta"):
            stamps = [(e.start_ms, e.end_ms) for e in events if e.type == kind]
            assert all(a < b and a % 200 == 0 and b % 200 == 0 for a, b in stamps), stamps
            assert stamps == sorted(stamps), stamps
        if "session.delegation.created" in kinds and "session.input_transcript.delta" in kinds:
            assert kinds.index("session.input_transcript.delta") < kinds.index("session.delegation.created")


async def test_commentary_without_a_delegation_makes_the_model_speak_now(cascade: ServerProc) -> None:
    client = AsyncOpenAI(api_key="unused", base_url=f"{cascade.url}/v1")
    async with client.live.connect(max_retries=0) as conn:
        await conn.session.start(session={"model": "gpt-live-1", "duplex": {"pace": "media"}})
        assert (await asyncio.wait_for(conn.recv(), 30)).type == "session.started"
        mic = Mic(conn)
        await mic.step(np.zeros(TICK_SAMPLES, np.float32))
        # How clients open a conversation: no hand-off to answer, the model is to speak now.
        await conn.session.commentary.append(content="Hello, how can I help you today?", delegation_id=None)
        await mic.wait(lambda: "help you" in mic.said().lower())
        ack = mic.of("session.commentary.appended")[0]
        first = mic.of("session.output_transcript.delta")[0]
        assert first.start_ms - ack.start_ms <= 2000, "spoken within two seconds of being placed"
        assert any(np.abs(a).max() > 1e-2 for a in mic.audio[first.start_ms // 200 :])
        await conn.session.close()


async def test_responses_delegation_runs_a_client_tool_and_speaks_the_answer(cascade: ServerProc) -> None:
    client = AsyncOpenAI(api_key="unused", base_url=f"{cascade.url}/v1")
    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    async with client.live.connect(max_retries=0) as conn:
        await conn.session.start(session={
            "model": "gpt-live-1", "duplex": {"pace": "media"},
            "delegation": {"type": "responses", "responses": {"model": "gpt-5.6-luna", "tools": [tool]}},
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": TOOL_CALL}]}],
        })
        started = await asyncio.wait_for(conn.recv(), 30)
        assert started.type == "session.started" and started.session.delegation.type == "responses"
        mic = Mic(conn)
        calls: list[Any] = []

        async def app(ev: Any) -> None:  # the app runs its function tools and hands the output back
            # The SDK keeps the nested Responses event as a dict (dispatch on its "type").
            if ev.type == "response.event" and ev.event["type"] == "response.output_item.done" \
                    and ev.event["item"]["type"] == "function_call":
                calls.append(ev.event["item"])
                await conn.response.item.create(item={"type": "function_call_output",
                                                      "call_id": ev.event["item"]["call_id"], "output": "sunny"})
                await conn.response.create()

        await mic.feed(np.concatenate([np.zeros(SAMPLE_RATE // 2, np.float32),
                                       speech("What is the weather like in Paris?"),
                                       np.zeros(SAMPLE_RATE, np.float32)]), app)
        await mic.wait(lambda: "sunny" in mic.said().lower(), app)
        created = mic.of("session.delegation.created")
        assert created and created[0].delegation.target == "responses" and created[0].delegation.response_id
        lifecycle = [e.event["type"] for e in mic.of("response.event")]
        assert lifecycle[0] == "response.created" and "response.completed" in lifecycle, lifecycle
        assert calls and calls[0]["name"] == "get_weather" and "Paris" in calls[0]["arguments"]
        assert all(e.delegation_id == created[0].delegation.id for e in mic.of("response.event"))
        done = next(e.event for e in mic.of("response.event") if e.event["type"] == "response.completed")
        assert done["response"]["status"] == "completed" and done["response"]["usage"]["output_tokens"] > 0
        assert "tool said: sunny" in mic.said().lower()
        await conn.session.close()
