"""Media sessions that share the embedded reasoner, on one clock of micro-turns: a request
that waits behind another session's counts that wait from the moment it was asked on the shared
clock, however far the reasoner's work has run ahead of the sessions; real-time requests run on the
wall. Real llama.cpp reasoner, real workers, in process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from models.background.clock import SharedWork
from server.background import BackgroundSettings, BackgroundWorker
from server.metrics import Metrics
from server.sessions import Pace, Session
from tests.server._event_sink import EventSink


async def _until(pred: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_requests_of_media_sessions_in_lockstep_are_timed_from_the_shared_moment() -> None:
    pytest.importorskip("llama_cpp")
    from models.background.llamacpp_backend import LlamaCppConfig, LlamaCppReasoner

    reasoner = LlamaCppReasoner(LlamaCppConfig(max_tokens=40))
    await asyncio.wrap_future(reasoner.preload())
    shared = SharedWork(reasoner.work_clock)
    metrics = Metrics()

    def worker(name: str, pace: Pace, media_clock: int | None, tick: int) -> BackgroundWorker:
        session = Session(id=name, resume_token="tok", state=None)
        session.sink = EventSink()
        session.settings.pace, session.settings.media_clock, session.tick = pace, media_clock, tick
        w = BackgroundWorker(session, reasoner, BackgroundSettings(), metrics, shared)
        session.background = w
        return w

    a = worker("a", Pace.MEDIA, 0, 11)  # A's micro-turn 10 is shared micro-turn 10
    b = worker("b", Pace.MEDIA, 4, 7)  # B's micro-turn 6 is shared micro-turn 10 too
    live = worker("rt", Pace.REALTIME, None, 3)
    try:
        a.request("Tell me about the moon in two sentences.", source="client", tick=10)
        await _until(lambda: a.clock.running)
        w0 = a.clock.position(10)
        assert w0 is not None
        # The reasoner works on A's answer while (in a media run) the sessions would still be stepping.
        await _until(lambda: reasoner.work_clock() - w0 > 0.1)
        b.request("Name a colour.", source="client", tick=6)
        await _until(lambda: b.clock.running)
        # B asked at shared micro-turn 10, when A asked: A's work since then is B's wait.
        assert b.clock.position(6) == pytest.approx(w0)
        assert b.clock.elapsed() >= 0.1
        live.request("Name a fruit.", source="client", tick=2)
        await _until(lambda: live.clock.running)
        assert live.clock.work is None  # real time: due when it exists
    finally:
        for w in (a, b, live):
            await w.stop()
        await reasoner.aclose()
