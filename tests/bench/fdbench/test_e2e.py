"""A tiny generated set, run end to end against a real server (echo model) and scored.

The echo model with delay 0 answers every micro-turn with that micro-turn's input, so a correctly
aligned output.wav is exactly the input delayed by one micro-turn (200 ms): that checks the
harness's timeline placement in both paces without trusting any other model.
"""

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.fdbench.__main__ import main
from bench.fdbench.client import StreamResult, _append, _connect, _expect, _receive
from bench.fdbench.generate import generate
from bench.fdbench.layout import find_samples
from bench.fdbench.runner import run
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, TICK_SECONDS
from streaming.wav import read_wav
from tests.bench._bench_clip import keep_first
from tests.conftest import ServerProc, start_server

TASKS = (
    "synthetic_pause_handling",
    "candor_turn_taking",
    "synthetic_user_interruption",
    "icc_backchannel",
    "user_interruption",
)


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fdb") / "set"
    generate(out, samples=1, v15_samples=1, seed=7, tasks=TASKS)
    return out


@pytest.fixture(scope="module")
def echo0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """One echo:0 server for the module's three runs (a start is ~1.5 s): each run opens sessions of its
    own and closes them; an echo session keeps nothing that another could see."""
    srv = start_server("--model", "echo:0", tmp_path=tmp_path_factory.mktemp("echo0"))
    yield srv
    srv.stop()


def delay_error(inp: np.ndarray, out: np.ndarray, delay: int) -> float:
    """Relative error between `out` and `inp` shifted right by `delay` samples."""
    want = np.concatenate([np.zeros(delay, np.float32), inp[: len(inp) - delay]])
    return float(np.abs(out - want).max() / (np.abs(inp).max() + 1e-9))


def test_generated_layout_is_official(tiny_set: Path) -> None:
    samples = {s.group: s for s in find_samples(tiny_set)}
    assert set(samples) == set(TASKS)
    pause = json.loads((samples["synthetic_pause_handling"].file("pause.json")).read_text())
    assert pause[0]["text"] == "[PAUSE]" and pause[0]["timestamp"][0] < pause[0]["timestamp"][1]
    tt = json.loads(samples["candor_turn_taking"].file("turn_taking.json").read_text())
    assert tt[0]["text"] == "[TURN-TAKING]"
    ui = json.loads(samples["synthetic_user_interruption"].file("interrupt.json").read_text())
    assert set(ui[0]) == {"context", "interrupt", "timestamp"}
    for name in ("context.wav", "interrupt.wav"):
        assert samples["synthetic_user_interruption"].file(name).exists()
    gt = json.loads((tiny_set / "icc_backchannel" / "icc_gt_distribution.json").read_text())
    assert sum(gt["1"]) == pytest.approx(1.0)
    meta = json.loads(samples["user_interruption"].file("metadata.json").read_text())
    start, end = meta["timestamps"]
    clean, _ = read_wav(samples["user_interruption"].file("clean_input.wav"))
    mixed, rate = read_wav(samples["user_interruption"].file("input.wav"))
    assert rate == 16000 and len(clean) == len(mixed)
    # The overlap is in input.wav only, and only inside its timestamps.
    diff = np.flatnonzero(np.abs(mixed - clean) > 1e-3)
    assert start - 0.05 <= diff[0] / rate and diff[-1] / rate <= end + 0.05


def test_media_run_is_aligned_and_scores(
    tiny_set: Path, echo0: ServerProc, capsys: pytest.CaptureFixture[str]
) -> None:
    server = echo0
    summary = run(tiny_set, server.ws_url, pace="media")
    assert summary.failed == {} and len(summary.done) == len(TASKS)
    for sample in find_samples(tiny_set):
        inp, _ = read_wav(sample.file("input.wav"))
        out, rate = read_wav(sample.file("output.wav"))
        assert rate == 16000 and len(out) == len(inp), sample.name
        assert delay_error(inp, out, 3200) < 0.05, sample.name  # 200 ms at 16 kHz
    overlap = next(s for s in find_samples(tiny_set) if s.kind == "overlap")
    clean_in, _ = read_wav(overlap.file("clean_input.wav"))
    clean_out, _ = read_wav(overlap.file("clean_output.wav"))
    assert delay_error(clean_in, clean_out, 3200) < 0.05
    assert json.loads((tiny_set / "run.json").read_text())["model"] == "echo"

    assert main(["score", "--data", str(tiny_set), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["errors"] == {}
    assert {g: t["samples"] for g, t in res["tasks"].items()} == dict.fromkeys(TASKS, 1)
    # Echo talks over the user the whole time: it takes the floor in the pause and "answers" the
    # turn before the user has finished.
    assert res["tasks"]["synthetic_pause_handling"]["tor"] == 1.0
    assert res["tasks"]["candor_turn_taking"]["early_speech_rate"] == 1.0
    # The user is silent just before the overlap, so the echo is too when it begins: nothing to stop.
    v15 = res["tasks"]["user_interruption"]
    assert v15["speaking_at_overlap_rate"] == 0.0 and v15["stop_latency"] is None
    written = json.loads((tiny_set / "candor_turn_taking" / "1" / "output.json").read_text())
    assert written["chunks"] and set(written["chunks"][0]) == {"text", "timestamp"}

    # The event log places each response where its first audio is heard: the echo's starts with the
    # input's first sound, one micro-turn later, and it is done once the clip ends.
    for sample in find_samples(tiny_set):
        inp, rate = read_wav(sample.file("input.wav"))
        log = json.loads(sample.file("output.events.json").read_text())
        created = [e for e in log if e["type"] == "response.created"]
        assert created and all(set(e) == {"t", "tick", "type", "text"} for e in log), sample.name
        onset = int(np.argmax(np.abs(inp) > 0)) / rate
        assert onset < created[0]["t"] <= onset + 0.2 + 1e-6, (sample.name, onset, created[0])
        assert created[0]["tick"] == int(created[0]["t"] / 0.2 + 0.5) - 1
        done = [e for e in log if e["type"] == "response.done"]
        assert done and done[-1]["text"] == "completed" and done[-1]["t"] <= len(inp) / rate + 0.4 + 1e-6


def test_realtime_run_records_both_placements(tmp_path: Path, echo0: ServerProc) -> None:
    data = tmp_path / "rt"
    generate(data, samples=1, v15_samples=0, seed=3, tasks=("synthetic_pause_handling",))
    sample = find_samples(data)[0]
    keep_first(sample.file("input.wav"), 4.0)  # the first speech and silence after it (the clip is 7.6 s)
    server = echo0
    summary = run(data, server.ws_url, pace="realtime")
    assert summary.failed == {}
    inp, _ = read_wav(sample.file("input.wav"))
    by_tick, _ = read_wav(sample.file("output.wav"))
    by_clock, _ = read_wav(sample.file("output_wallclock.wav"))
    assert len(by_tick) == len(by_clock) == len(inp)
    assert delay_error(inp, by_tick, 3200) < 0.05
    # Wall-clock placement is later than the ideal by the real delays, but not by a whole second.
    lags = [int(np.argmax(np.abs(by_clock) > 0.01)) - int(np.argmax(np.abs(inp) > 0.01))]
    assert 3200 - 160 <= lags[0] <= 3200 + 16000
    assert summary.lateness and max(summary.lateness) < 1.0


async def _stalled_stream(url: str, audio: np.ndarray, stall_after: int, stall: float) -> StreamResult:
    """A real-time client whose sender stalls once, as a loaded machine's does."""
    result = StreamResult(ticks=len(audio) // TICK_SAMPLES, base=0)
    async with _connect(url, open_timeout=20.0) as ws:
        await _expect(ws, "session.created", 20.0)
        await ws.send(json.dumps({"type": "session.update", "session": {"duplex": {"tick_stats": True}}}))
        await _expect(ws, "session.updated", 20.0)
        t0 = time.monotonic()
        receiver = asyncio.create_task(_receive(ws, result, asyncio.Event(), result.ticks, lambda: t0))
        for i in range(result.ticks):
            if i == stall_after:
                await asyncio.sleep(stall)
            await ws.send(_append(audio[i * TICK_SAMPLES : (i + 1) * TICK_SAMPLES]))
            await asyncio.sleep(TICK_SECONDS)
        await asyncio.sleep(1.0)
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
    return result


def test_realtime_tick_placement_follows_what_each_micro_turn_heard(echo0: ServerProc) -> None:
    server = echo0
    audio = (0.3 * np.random.default_rng(5).standard_normal(16 * TICK_SAMPLES)).clip(-1, 1).astype(np.float32)
    result = asyncio.run(_stalled_stream(server.ws_url, audio, stall_after=5, stall=0.5))
    # The half-second stall made the server step micro-turns that heard nothing; every later one
    # answers an older chunk than its index says.
    assert result.underruns()
    assert result.heard[max(result.heard)] == len(audio)
    # Placed by what each micro-turn heard, the echo is still exactly the input one micro-turn later
    # (PCM16 rounding aside); placed by index it would be shifted after the stall.
    want = np.concatenate([np.zeros(TICK_SAMPLES, np.float32), audio[:-TICK_SAMPLES]])
    assert np.abs(result.tick_placement(len(audio)) - want).max() < 1e-3


def test_deltas_after_the_input_ended_are_timed_from_their_own_micro_turn() -> None:
    """The answer goes on after the clip: those micro-turns all heard the whole clip, but each plays a
    micro-turn after the one before, so a delta that arrives in its own micro-turn is not late."""
    tick_s = TICK_SAMPLES / SAMPLE_RATE
    result = StreamResult(ticks=3, base=0)
    result.heard = {k: min(k + 1, 3) * TICK_SAMPLES for k in range(6)}  # ticks 2-5 heard all 3 chunks
    result.by_tick = {k: [np.zeros(TICK_SAMPLES, np.float32)] for k in range(6)}
    result.arrivals = [((k + 1) * tick_s + 0.01, k, 0) for k in range(6)]  # each 10 ms after it could play
    assert result.lateness() == pytest.approx([0.01] * 6, abs=1e-6)


def test_transcript_timestamps_survive_silence_cropping() -> None:
    from bench.fdbench.align import transcribe
    from bench.fdbench.generate import Speaker, Voice

    speech = Speaker().say("what is the weather like tomorrow", Voice("piper:joe", 1.0, 1.0))
    padded = np.concatenate([np.zeros(32000, np.float32), speech, np.zeros(16000, np.float32)])
    plain, shifted = transcribe(speech), transcribe(padded, offset=1.0)
    assert plain["text"] and shifted["text"] == plain["text"]
    # 2 s of leading silence plus the 1 s offset: every word moves by 3 s.
    for a, b in zip(plain["chunks"], shifted["chunks"], strict=True):
        assert b["timestamp"][0] == pytest.approx(a["timestamp"][0] + 3.0, abs=0.05)


def test_run_without_a_server_names_every_sample(tiny_set: Path, tmp_path: Path) -> None:
    import shutil

    from tests.conftest import free_port

    data = tmp_path / "copy"
    shutil.copytree(tiny_set, data)
    summary = run(data, f"ws://127.0.0.1:{free_port()}/v1/realtime", pace="media")
    assert summary.done == []
    assert set(summary.failed) == {s.name for s in find_samples(data)}
    assert all("cannot connect" in why and "duplex serve" in why for why in summary.failed.values())
    with pytest.raises(ValueError, match="must be a WebSocket URL"):
        run(data, "http://127.0.0.1:1/v1/realtime")


def test_generate_offers_only_the_tasks_it_can_synthesise(capsys: pytest.CaptureFixture[str]) -> None:
    # candor_pause_handling is an official folder of real recordings: scored, never generated.
    with pytest.raises(SystemExit) as stop:
        main(["generate", "--out", "unused", "--tasks", "candor_pause_handling"])
    assert stop.value.code == 2 and "invalid choice: 'candor_pause_handling'" in capsys.readouterr().err
