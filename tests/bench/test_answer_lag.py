"""bench.answer_lag on event logs written the way `bench.fdbench run` writes them."""

import json
import math
from pathlib import Path

import pytest

from bench.answer_lag import main, run_lags, sample_lags


def _ev(t: float, kind: str, text: str = "") -> dict[str, object]:
    return {"t": t, "tick": round(t / 0.2), "type": kind, "text": text}


ANSWERED = [  # ack created in the delegate's micro-turn, before it; the answer 3.8 s later
    _ev(1.0, "input_audio_buffer.speech_started"),
    _ev(6.0, "response.created", "in_progress"),
    _ev(6.0, "duplex.event", "delegate"),
    _ev(6.8, "response.done", "completed"),
    _ev(9.8, "response.created", "in_progress"),
]
INTERRUPTED = [  # first answer at 2.4 s; the interruption's answer never came before the clip ended
    _ev(4.6, "response.created"), _ev(4.6, "duplex.event", "delegate"), _ev(7.0, "response.created"),
    _ev(11.6, "response.created"), _ev(11.6, "duplex.event", "delegate"), _ev(12.2, "response.done"),
]


def test_sample_lags_skip_the_acknowledgment_and_count_the_unanswered() -> None:
    assert sample_lags(ANSWERED) == [pytest.approx(3.8)]
    lags = sample_lags(INTERRUPTED)
    assert lags[0] == pytest.approx(2.4) and math.isinf(lags[1]) and len(lags) == 2


def test_an_answer_that_plays_on_in_the_acknowledgments_response_starts_at_its_first_phrase() -> None:
    """A fast answer follows "Okay." in the same response: no response.created marks it, its first
    transcript delta does (the acknowledgment's is at the delegate's micro-turn or before it)."""
    events = [
        _ev(5.8, "response.created"), _ev(5.8, "response.output_audio_transcript.delta", "Okay. "),
        _ev(6.0, "duplex.event", "delegate"),
        _ev(7.4, "response.output_audio_transcript.delta", "The ocean is vast, "),
        _ev(9.0, "response.output_audio_transcript.delta", "and deep. "), _ev(10.2, "response.done"),
        _ev(12.0, "response.created"),  # a later reply: not this answer's start
    ]
    assert sample_lags(events) == [pytest.approx(1.4)]
    unanswered = [*events[:3], _ev(10.0, "response.done")]
    assert math.isinf(sample_lags(unanswered)[0])


def _run(tmp_path: Path) -> Path:
    for task, n, events in [("candor_turn_taking", 1, ANSWERED), ("synthetic_user_interruption", 1, INTERRUPTED),
                            ("synthetic_pause_handling", 1, ANSWERED)]:
        d = tmp_path / task / str(n)
        d.mkdir(parents=True)
        (d / "output.events.json").write_text(json.dumps(events))
    return tmp_path


def test_a_run_pools_turn_taking_and_interruption_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lags = run_lags(_run(tmp_path))
    assert sorted(x for x in lags.lags if not math.isinf(x)) == [pytest.approx(2.4), pytest.approx(3.8)]
    assert lags.unanswered == 1
    assert lags.quantile(0.5) == pytest.approx(3.8) and math.isinf(lags.quantile(0.9) or 0.0)
    assert main([str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"run": str(tmp_path), "questions": 3, "unanswered": 1, "p50": pytest.approx(3.8), "p90": None}


def test_a_folder_without_a_run_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"bench\.fdbench run"):
        run_lags(tmp_path)
