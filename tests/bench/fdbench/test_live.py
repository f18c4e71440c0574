"""`bench.fdbench run --protocol live`: the same layout through GPT-Live (`/v1/live/sessions`).

As in test_e2e.py, the echo model with delay 0 answers every micro-turn with its own input, so a
correctly placed output.wav is the input one micro-turn (200 ms) later, whatever protocol carried it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.answer_lag import sample_lags
from bench.fdbench import live_client
from bench.fdbench.__main__ import main
from bench.fdbench.client import StreamResult
from bench.fdbench.generate import generate
from bench.fdbench.layout import find_samples
from bench.fdbench.runner import run
from bench.wsclient import open_session
from streaming.types import TICK_SAMPLES
from streaming.wav import read_wav
from tests.bench._bench_clip import keep_first
from tests.conftest import ServerProc, start_server

TASKS = ("synthetic_pause_handling", "user_interruption")  # v1.0 and a v1.5 sample (input and clean_input)
OUT_TICK = 3200  # one micro-turn at 16 kHz


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fdb-live") / "set"
    generate(out, samples=1, v15_samples=1, seed=11, tasks=TASKS)
    return out


@pytest.fixture(scope="module")
def echo0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--max-sessions", "4", "--background", "none",
                       tmp_path=tmp_path_factory.mktemp("echo0-live"))
    yield srv
    srv.stop()


def live_url(server: ServerProc) -> str:
    return f"ws://{server.host}:{server.port}{live_client.PATH}"


def delay_error(inp: np.ndarray, out: np.ndarray, delay: int) -> float:
    want = np.concatenate([np.zeros(delay, np.float32), inp[: len(inp) - delay]])
    return float(np.abs(out - want).max() / (np.abs(inp).max() + 1e-9))


def test_live_media_run_is_aligned(tiny_set: Path, echo0: ServerProc) -> None:
    summary = run(tiny_set, live_url(echo0), pace="media", protocol="live")
    assert summary.failed == {} and summary.server_errors == {} and len(summary.done) == len(TASKS)
    for sample in find_samples(tiny_set):
        pairs = [("input.wav", "output")] + ([("clean_input.wav", "clean_output")] if sample.kind == "overlap" else [])
        for inp_name, out_stem in pairs:
            inp, _ = read_wav(sample.file(inp_name))
            out, rate = read_wav(sample.file(f"{out_stem}.wav"))
            assert rate == 16000 and len(out) == len(inp), sample.name
            assert delay_error(inp, out, OUT_TICK) < 0.05, (sample.name, out_stem)
            assert json.loads(sample.file(f"{out_stem}.events.json").read_text()) == []  # echo says no words
    info = json.loads((tiny_set / "run.json").read_text())
    assert info["protocol"] == "live" and info["model"] == "echo" and info["url"].endswith("/v1/live/sessions")


@pytest.mark.serial  # real time: beside the parallel suite a loaded machine shifted half its micro-turns (CI)
def test_live_realtime_run_records_both_placements(tmp_path: Path, echo0: ServerProc) -> None:
    data = tmp_path / "rt"
    generate(data, samples=1, v15_samples=0, seed=3, tasks=("synthetic_pause_handling",))
    sample = find_samples(data)[0]
    keep_first(sample.file("input.wav"), 4.0)  # the first speech and silence after it (the clip is 7.6 s)
    summary = run(data, live_url(echo0), pace="realtime", protocol="live")
    assert summary.failed == {}
    inp, _ = read_wav(sample.file("input.wav"))
    by_tick, _ = read_wav(sample.file("output.wav"))
    by_clock, _ = read_wav(sample.file("output_wallclock.wav"))
    assert len(by_tick) == len(by_clock) == len(inp)
    # GPT-Live says nothing of what a real-time micro-turn heard, so one stepped before its chunk
    # arrived (a busy machine) shifts the rest by a micro-turn: most micro-turns must still line up.
    want = np.concatenate([np.zeros(OUT_TICK, np.float32), inp[:-OUT_TICK]])
    n = len(inp) // OUT_TICK
    aligned = sum(np.abs(by_tick[k * OUT_TICK:(k + 1) * OUT_TICK] - want[k * OUT_TICK:(k + 1) * OUT_TICK]).max() < 0.01
                  for k in range(n))
    assert aligned >= 0.9 * n, (aligned, n)
    assert summary.lateness and max(summary.lateness) < 1.0


def test_run_refuses_the_other_protocols_url_and_media_lockstep(tiny_set: Path, echo0: ServerProc,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--data", str(tiny_set), "--url", echo0.ws_url, "--protocol", "live"]) == 2
    assert f"use {live_url(echo0)}" in capsys.readouterr().err
    assert main(["run", "--data", str(tiny_set), "--url", live_url(echo0), "--protocol", "realtime"]) == 2
    assert main(["run", "--data", str(tiny_set), "--url", live_url(echo0), "--protocol", "live",
                 "--concurrency", "2"]) == 2
    assert "media_clock" in capsys.readouterr().err


class Replay:
    """A socket that yields recorded server messages (the transport, not our code, is what is replaced)."""

    def __init__(self, events: list[dict[str, object]]) -> None:
        self.events = events

    async def __aiter__(self) -> AsyncIterator[str]:
        for ev in self.events:
            yield json.dumps(ev)


def _audio(loud: bool) -> dict[str, object]:
    pcm = (np.full(TICK_SAMPLES, 3000 if loud else 0, "<i2")).tobytes()
    return {"type": "session.output_audio.delta", "delta": base64.b64encode(pcm).decode()}


def test_live_events_are_logged_in_the_realtime_logs_vocabulary() -> None:
    """A cascade hand-off as the server sent it (order and stamps from a recorded session): each event
    is logged on its micro-turn, under the name the Realtime log gives the same thing, so
    bench.answer_lag reads the lag from the hand-off to the answer's first words."""
    events: list[dict[str, object]] = [_audio(False) for _ in range(16)]
    events += [
        _audio(True),
        {"type": "session.input_transcript.delta", "delta": "can you look up the weather", "start_ms": 600,
         "end_ms": 3400},
        {"type": "session.output_transcript.delta", "delta": "Okay. ", "start_ms": 3200, "end_ms": 3400},
        {"type": "session.delegation.created", "offset_ms": 3200,
         "delegation": {"id": "item_1", "type": "delegation", "target": "client"}},
        _audio(True), _audio(False), _audio(True),
        {"type": "session.output_transcript.delta", "delta": "It is sunny. ", "start_ms": 3800, "end_ms": 4000},
        {"type": "session.closed", "reason": "close_requested"},
        _audio(True),  # after the close: not read
    ]
    result = StreamResult(ticks=25, base=0)
    done = asyncio.Event()
    asyncio.run(live_client._receive(Replay(events), result, done, 20, lambda: 0.0))
    assert sorted(result.by_tick) == list(range(20)) and done.is_set()
    assert result.transcript == ["Okay. ", "It is sunny. "]
    log = result.event_log()
    assert [(e["tick"], e["type"], e["text"]) for e in log] == [
        (16, "session.input_transcript.delta", "can you look up the weather"),
        (16, "response.output_audio_transcript.delta", "Okay. "),
        (16, "duplex.event", "delegate"),
        (19, "response.output_audio_transcript.delta", "It is sunny. "),
    ]
    assert log[2]["t"] == pytest.approx(3.4)  # heard from the end of its micro-turn
    assert sample_lags(log) == [pytest.approx(0.6)]


async def _delegation(url: str) -> object:
    async with open_session(url) as ws:
        started = await live_client.start_like_realtime(ws, "media")
        return started["session"]["delegation"]["type"]


def test_hand_offs_go_to_the_servers_reasoner_when_it_has_one(echo0: ServerProc, tmp_path: Path) -> None:
    """As on /v1/realtime: Responses delegation on a server with a reasoner (one configured is enough to
    start; nothing here hands off), client delegation on one without (the refused start opens nothing)."""
    assert asyncio.run(_delegation(live_url(echo0))) == "client"
    with_reasoner = start_server("--model", "echo:0", "--background", "openai", "--background-url",
                                 "http://127.0.0.1:9", tmp_path=tmp_path)
    try:
        assert asyncio.run(_delegation(live_url(with_reasoner))) == "responses"
    finally:
        with_reasoner.stop()
