"""Engine faults through the real app and a real WebSocket client: a model step that fails for one
session, a step that hangs, an engine loop that dies (and /healthz)."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from models.base import TickInput, TickOutput
from models.echo import EchoModel, EchoState
from tests.conftest import ROOT
from tests.server._inproc import healthz, serve_in_thread
from tests.wsclient import TICK, pcm16, random_pcm, recv_event, send, start_session

HANG_S = 1.5


class FaultyEcho(EchoModel):
    """Echo (no delay) that raises when a session typed 'boom' and sleeps when one typed 'hang'.

    A hand-written fake at the edge: no real model fails on cue. Each step also takes 10 ms, so that
    sessions become ready while one runs and share the next batch."""

    name = "faulty-echo"

    def __init__(self) -> None:
        super().__init__(delay=0)
        self.failed_batches: list[int] = []  # sizes of the batches that raised

    def step(self, batch: Sequence[tuple[EchoState, TickInput]]) -> list[TickOutput]:
        texts = " ".join(" ".join(tick.text) for _, tick in batch)
        if "hang" in texts:
            time.sleep(HANG_S)
        if "boom" in texts:
            self.failed_batches.append(len(batch))
            raise RuntimeError("boom: the model failed on this session's input")
        time.sleep(0.01)
        return super().step(batch)


def typed(text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


async def test_a_failing_session_does_not_take_its_batch_down() -> None:
    model = FaultyEcho()
    with serve_in_thread(model, max_sessions=4, phase_groups=1) as srv:
        bad, _ = await start_session(srv.ws_url, pace="media")
        good, _ = await start_session(srv.ws_url, pace="media")
        n = 40
        audio = random_pcm(n * TICK, seed=9)
        chunks = [pcm16(audio[k * TICK:(k + 1) * TICK]) for k in range(n)]
        got: dict[int, bytes] = {}
        bad_errors: list[dict[str, Any]] = []

        async def read_good() -> None:
            while len(got) < n:
                ev = await recv_event(good, 15)
                assert ev["type"] != "error", f"the healthy session got an error: {ev}"
                if ev["type"] == "response.output_audio.delta":
                    got[ev["tick"]] = base64.b64decode(ev["delta"])

        async def read_bad() -> None:
            while True:
                ev = await recv_event(bad, 15)
                if ev["type"] == "error":
                    bad_errors.append(ev)

        readers = [asyncio.create_task(read_good()), asyncio.create_task(read_bad())]
        for chunk in chunks:  # the failing session types 'boom' (and streams) while the healthy one streams
            await send(bad, typed("boom"))
            await bad.send(chunk)
            await good.send(chunk)
            await asyncio.sleep(0.005)
        await asyncio.wait_for(readers[0], 20)
        readers[1].cancel()
        await good.close()
        await bad.close()
    assert max(model.failed_batches) >= 2, "the failure never hit a shared batch; the test proved nothing"
    assert [got[k] for k in range(n)] == chunks, "the healthy session's echo is exact, tick by tick"
    assert bad_errors and all(e["error"]["code"] == "model_error" for e in bad_errors)
    assert "boom" in bad_errors[0]["error"]["message"]


async def test_a_hung_step_is_reported_and_healthz_says_so() -> None:
    with serve_in_thread(FaultyEcho(), max_sessions=2, phase_groups=1, step_watchdog_s=0.3) as srv:
        ws, _ = await start_session(srv.ws_url, pace="media")
        assert (await asyncio.to_thread(healthz, srv.url))[0] == 200
        await send(ws, typed("hang"))
        deadline = time.monotonic() + HANG_S
        status, body = 200, dict[str, Any]()
        while status == 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            status, body = await asyncio.to_thread(healthz, srv.url)
        assert status == 503 and "hung" in body["problem"], body
        metrics = (await asyncio.to_thread(httpx.get, srv.url + "/metrics")).text
        assert "duplex_hung_steps_total 1.0" in metrics
        deadline = time.monotonic() + HANG_S + 2
        while status != 200:
            assert time.monotonic() < deadline, "healthz stayed 503 after the step finished"
            await asyncio.sleep(0.1)
            status, body = await asyncio.to_thread(healthz, srv.url)
        await ws.close()


async def test_a_missed_deadline_is_logged_with_where_the_time_went(caplog: pytest.LogCaptureFixture) -> None:
    """An operator reading the log learns that the step itself ran long (not a late start)."""
    caplog.set_level(logging.WARNING, logger="server.engine")
    with serve_in_thread(FaultyEcho(), max_sessions=2, phase_groups=1, step_watchdog_s=5.0) as srv:
        # This client reads nothing while it streams: with websockets' default 16-message queue its
        # reading stopped behind the unread audio deltas, so close() never saw the server's close frame
        # and waited out its 10 s close_timeout. An unbounded queue takes them all in.
        ws, _ = await start_session(srv.ws_url, pace="realtime", max_queue=None)
        audio = random_pcm(15 * TICK, seed=3)
        t0 = time.monotonic()
        for k in range(15):  # 3 s of real-time audio; the step of the 'hang' micro-turn sleeps 1.5 s
            if k == 2:
                await send(ws, typed("hang"))
            await ws.send(pcm16(audio[k * TICK:(k + 1) * TICK]))
            await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.2 - time.monotonic()))
        metrics = (await asyncio.to_thread(httpx.get, srv.url + "/metrics")).text
        await ws.close()
    missed = [float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("duplex_missed_deadlines_total")]
    assert missed and missed[0] >= 1, metrics
    lines = [r.getMessage() for r in caplog.records if "missed their deadline" in r.getMessage()]
    assert lines, "a missed deadline was counted but not logged"
    ran = [int(x) for x in re.findall(r"ran (\d+) ms", lines[0])]
    assert ran and ran[0] >= HANG_S * 1000 * 0.9, lines[0]


async def test_healthz_answers_503_when_an_engine_loop_is_dead() -> None:
    with serve_in_thread(EchoModel(), max_sessions=2, phase_groups=1) as srv:
        assert (await asyncio.to_thread(healthz, srv.url))[0] == 200
        # Kill the real-time loop the way a bug would: the task ends while the server keeps serving.
        srv.on_loop(lambda: srv.runtime.engine._loops[0].cancel())
        status, body = await asyncio.to_thread(healthz, srv.url)
        assert status == 503 and body["status"] == "unhealthy" and "duplex-realtime" in body["problem"], body


class ClosableEcho(EchoModel):
    """Echo that records the shutdown call a model with threads or files to release would implement."""

    name = "closable-echo"

    def __init__(self) -> None:
        super().__init__(delay=1)
        self.shut_down_on: str | None = None

    def shutdown(self) -> None:
        import threading

        self.shut_down_on = threading.current_thread().name


async def test_stopping_the_server_closes_its_sessions_and_the_model() -> None:
    model = ClosableEcho()
    with serve_in_thread(model, max_sessions=2, phase_groups=1) as srv:
        ws, _ = await start_session(srv.ws_url, pace="media")
        runtime = srv.runtime
    # uvicorn exited: the lifespan drained the session (told why), then shut the model down on its thread.
    closing = await recv_event(ws, 5)
    assert closing["type"] == "duplex.session.closing" and closing["code"] == 1001
    assert len(runtime.registry) == 0 and runtime.draining
    assert model.shut_down_on is not None and model.shut_down_on.startswith("duplex-inference")


def test_the_app_serves_without_webrtc_when_aiortc_is_missing() -> None:
    """Only a missing aiortc/PyAV disables WebRTC (with a warning); other import errors are not hidden."""
    code = (
        "import sys, logging; sys.modules['aiortc'] = None\n"
        "logging.basicConfig(level='WARNING')\n"
        "from server.app import create_app; from server.config import ServerConfig\n"
        "app = create_app(ServerConfig(model='echo'))\n"
        "print(sorted(r.path for r in app.routes if 'calls' in r.path))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]" and "WebRTC disabled: aiortc is not installed" in out.stderr
