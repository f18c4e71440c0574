"""bench.live_delegation: the hand-off's timing read from a recorded cascade session, and the bench
end to end through a real `/v1/live/sessions` (echo, which never hands off: reported, exit 1)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import numpy as np
import pytest

from bench import live_delegation
from bench.live_delegation import Trial, quantile
from streaming.types import TICK_SAMPLES
from tests.conftest import ServerProc, start_server

ANSWER = "The weather in Paris is sunny and warm today."


def _audio(loud: bool) -> dict[str, object]:
    pcm = np.full(TICK_SAMPLES, 4000 if loud else 0, "<i2").tobytes()
    return {"type": "session.output_audio.delta", "delta": base64.b64encode(pcm).decode()}


def test_a_trial_measures_from_the_hand_off_to_the_commentarys_first_sound() -> None:
    """The order and stamps of a real cascade session: the hand-off in micro-turn 16 with "Okay.",
    the commentary placed on 17, its words from 19 (micro-turn 18 silent between the two)."""
    trial = Trial("Can you look up the weather in Paris for me?", ANSWER)
    t = 0.0
    for _ in range(16):
        t += 0.2
        assert trial.on_event(_audio(False), t) is None
    t += 0.2
    trial.on_event(_audio(True), t)
    trial.on_event({"type": "session.input_transcript.delta", "delta": "can you look up the weather in paris",
                    "start_ms": 600, "end_ms": 3400}, t)
    trial.on_event({"type": "session.output_transcript.delta", "delta": "Okay. ", "start_ms": 3200,
                    "end_ms": 3400}, t)
    reply = trial.on_event({"type": "session.delegation.created", "offset_ms": 3200,
                            "delegation": {"id": "item_5", "type": "delegation", "target": "client"}}, t + 0.01)
    assert reply == {"type": "session.commentary.append", "content": ANSWER, "delegation_id": "item_5"}
    trial.on_event({"type": "session.commentary.appended", "start_ms": 3400, "end_ms": 3600}, t + 0.05)
    for loud in (True, False, True):  # 17: the end of "Okay.", 18: silence, 19: the commentary
        t += 0.2
        trial.on_event(_audio(loud), t)
    # "Okay." again would not be the commentary; its own first words are.
    trial.on_event({"type": "session.output_transcript.delta", "delta": "The weather in Paris is sunny ",
                    "start_ms": 3800, "end_ms": 4000}, t)
    assert trial.onset_tick() == 19 and trial.timeline_s() == pytest.approx(0.6)
    assert trial.latency_s() == pytest.approx(0.59)  # 19's delta at 4.0 s, the hand-off read at 3.41 s
    assert trial.said_before() == "Okay." and trial.heard.startswith("can you look up")
    assert not trial.done()  # only its first micro-turn heard yet
    t += 0.2
    trial.on_event(_audio(True), t)
    t += 0.2
    trial.on_event(_audio(True), t)
    assert trial.done()


def test_a_trial_without_a_hand_off_measures_nothing() -> None:
    trial = Trial("q", ANSWER)
    trial.on_event(_audio(True), 0.2)
    trial.on_event({"type": "session.output_transcript.delta", "delta": "The weather", "start_ms": 0,
                    "end_ms": 200}, 0.2)
    assert trial.latency_s() is None and trial.timeline_s() is None and trial.onset_tick() is None


def test_quantiles_are_values_some_trial_measured() -> None:
    assert quantile([0.4, 0.6, 0.5, 1.0], 0.5) == 0.5 and quantile([0.4, 0.6, 0.5, 1.0], 0.9) == 1.0
    assert quantile([], 0.5) is None


@pytest.fixture
def echo0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--max-sessions", "2", tmp_path=tmp_path_factory.mktemp("echo0-deleg"))
    yield srv
    srv.stop()


def test_the_bench_runs_through_a_real_live_session(echo0: ServerProc, capsys: pytest.CaptureFixture[str]) -> None:
    """The echo model says the question back and never hands off: the trial runs its whole length
    through `/v1/live/sessions` in media pace and is reported as not handed off (exit 1)."""
    assert live_delegation.main(["--url", echo0.url, "--trials", "1", "--pace", "media", "--json"]) == 1
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["trials"] == 1 and report["handed_off"] == 0 and report["measured"] == 0
    assert report["latency_s_p50"] is None and report["floor_met"] is False
    assert report["per_trial"][0]["errors"] == []
    assert "trial 1/1: not handed off" in out.err
