"""bench.answers: the loop detector, and a short run through the real embedded reasoner."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp", reason="the embedded background model needs llama-cpp-python")

from bench.answers import degenerate, echoed, main, prompts, served_messages, spoken_form


def test_loops_and_unbroken_runs_are_degenerate_and_answers_are_not() -> None:
    assert degenerate("it's a great way to learn to play, and " * 6)
    assert degenerate("1." * 40)
    assert not degenerate("Paris is the capital of France. It is famous for the Eiffel Tower and its museums.")
    assert not degenerate("Yes.")
    assert spoken_form("Can you help me plan a picnic?") == "can you help me plan a picnic"
    assert len(set(prompts())) == len(prompts()) >= 30


def test_a_question_said_back_is_an_echo_and_an_answer_is_not() -> None:
    q = "is a walk after dinner good for you"
    assert echoed(q, "Is a walk after dinner good for you? Yes.")
    assert echoed(q, "A walk after dinner is good for you.")  # true, but it only says the question back
    assert not echoed(q, "Yes, a short walk helps digestion and sleep.")
    assert not echoed(q, "Yes, a walk after dinner is good for you.")
    assert not echoed(q, "")
    # What the bench asks is what the server sends: the question as the user's own turn.
    assert served_messages(q)[1:] == [{"role": "user", "content": q}]


def test_a_short_run_reports_each_setting(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--prompts", "2", "--max-tokens", "24", "--repeat-penalty", "1.0,1.1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["questions"] == 2 and [r["repeat_penalty"] for r in out["results"]] == [1.0, 1.1]
    for r in out["results"]:
        assert r["answers"] == 2 and 0 < r["tokens_mean"] <= 24
        assert r["degenerate"] == len(r["degenerate_answers"]) <= 2
        assert r["echoed"] == len(r["echoed_answers"]) <= 2


def test_bad_settings_are_refused_with_what_to_pass() -> None:
    with pytest.raises(SystemExit):
        main(["--repeat-penalty", "none"])
    with pytest.raises(SystemExit):
        main(["--repeat-penalty", "0"])
