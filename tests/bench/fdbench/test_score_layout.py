"""`score` on a hand-built official-layout directory: known answers, and broken samples named.

The outputs here are transcripts written by hand (output.json, as a user bringing official
parakeet transcripts would have) and digitally silent wavs, so no ASR or VAD model is needed.
"""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.fdbench.__main__ import main
from bench.fdbench.score import score
from streaming.wav import write_wav


def transcript(*words: tuple[str, float, float]) -> dict[str, Any]:
    return {
        "text": " ".join(w for w, _, _ in words),
        "chunks": [{"text": w, "timestamp": [s, e]} for w, s, e in words],
    }


def put(folder: Path, name: str, data: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))


def silent_wav(path: Path, seconds: float) -> None:
    write_wav(path, np.zeros(int(seconds * 16000), dtype=np.float32), 16000)


@pytest.fixture
def official_dir(tmp_path: Path) -> Path:
    root = tmp_path / "fdb"
    long_answer = transcript(("sure", 3.2, 3.5), ("here", 3.6, 3.9), ("is", 4.0, 4.1), ("how", 4.2, 4.6))
    # candor_turn_taking: user ends at 3.0; sample 1 answers at 3.2, sample 2 starts early at 2.5,
    # sample 3 says nothing.
    tt = root / "candor_turn_taking"
    for i, (out, end) in enumerate([(long_answer, 3.0), (long_answer, 3.7), (transcript(), 3.0)], start=1):
        put(tt / str(i), "turn_taking.json", [{"text": "[TURN-TAKING]", "timestamp": [end, end + 5]}])
        put(tt / str(i), "output.json", out)
        silent_wav(tt / str(i) / "input.wav", 8.0)
    # Broken samples: malformed annotation, missing annotation, malformed transcript.
    put(tt / "4", "turn_taking.json", "{not json")
    put(tt / "4", "output.json", long_answer)
    put(tt / "5", "output.json", long_answer)
    silent_wav(tt / "5" / "input.wav", 8.0)
    put(tt / "6", "turn_taking.json", [{"text": "[TURN-TAKING]", "timestamp": [3.0, 8.0]}])
    put(tt / "6", "output.json", {"text": "x", "chunks": [{"text": "x"}]})
    # synthetic_pause_handling: one take-over, one short backchannel-like reply.
    ph = root / "synthetic_pause_handling"
    put(ph / "1", "pause.json", [{"text": "[PAUSE]", "timestamp": [2.0, 4.0]}])
    put(ph / "1", "output.json", long_answer)
    put(ph / "2", "pause.json", [{"text": "[PAUSE]", "timestamp": [2.0, 4.0]}])
    put(ph / "2", "output.json", transcript(("mhm", 2.5, 2.8)))
    # synthetic_user_interruption: interruption ends at 6.0; the model answers at 6.5.
    ui = root / "synthetic_user_interruption" / "1"
    put(ui, "interrupt.json", [{"context": "a", "interrupt": "b", "timestamp": [4.0, 6.0]}])
    put(
        ui,
        "output.json",
        transcript(("okay", 6.5, 6.9), ("so", 7.0, 7.2), ("the", 7.3, 7.4), ("short", 7.5, 7.9)),
    )
    silent_wav(ui / "output.wav", 12.0)
    (ui / "output.json").touch()  # newer than the wav: reused, not re-transcribed
    # icc_backchannel with a silent output: no backchannel at all -> JSD 1, frequency 0.
    bc = root / "icc_backchannel"
    silent_wav(bc / "1" / "output.wav", 10.0)
    put(bc / "1", "output.json", transcript())
    put(bc, "icc_gt_distribution.json", {"1": [0.2] * 5})
    return root


def test_score_known_answers_and_names_broken_samples(official_dir: Path) -> None:
    res = score(official_dir, progress=False)
    tt = res["tasks"]["candor_turn_taking"]
    assert tt["samples"] == 3
    assert tt["tor"] == pytest.approx(2 / 3)
    assert tt["latency"] == pytest.approx((0.2 + 0.0) / 2)  # early start floored at 0
    assert tt["raw_latency"] == pytest.approx((0.2 - 0.5) / 2)
    assert tt["early_speech_rate"] == pytest.approx(0.5)
    assert res["tasks"]["synthetic_pause_handling"]["tor"] == pytest.approx(0.5)
    ui = res["tasks"]["synthetic_user_interruption"]
    assert ui["tor"] == 1.0 and ui["latency"] == pytest.approx(0.5)
    assert ui["stop_latency"] is None  # silent output: nothing to stop
    assert "not available offline" in ui["relevance"]
    bc = res["tasks"]["icc_backchannel"]
    assert bc["jsd"] == 1.0 and bc["frequency"] == 0.0 and bc["tor"] == 0
    errors = res["errors"]
    assert set(errors) == {"candor_turn_taking/4", "candor_turn_taking/5", "candor_turn_taking/6"}
    assert "turn_taking.json is not valid json" in errors["candor_turn_taking/4"]
    assert "missing turn_taking.json" in errors["candor_turn_taking/5"]
    assert "output.json does not follow the schema" in errors["candor_turn_taking/6"]


def test_score_cli_table_and_json(official_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["score", "--data", str(official_dir)]) == 0
    table = capsys.readouterr().out
    assert "LOCAL SYNTHETIC DATA" in table and "Moshi" in table
    assert "NOT SCORED candor_turn_taking/4" in table
    assert main(["score", "--data", str(official_dir), "--json", "--asr", "never"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tasks"]["candor_turn_taking"]["samples"] == 3
    assert "candor_turn_taking/5" in data["errors"]


def test_score_missing_gt_and_missing_output(tmp_path: Path) -> None:
    bc = tmp_path / "icc_backchannel" / "7"
    silent_wav(bc / "input.wav", 3.0)
    res = score(tmp_path, progress=False)
    assert "icc_gt_distribution.json" in res["errors"]["icc_backchannel/7"]
    put(tmp_path / "icc_backchannel", "icc_gt_distribution.json", {"0": [1.0]})
    res = score(tmp_path, progress=False)
    assert "missing output.wav" in res["errors"]["icc_backchannel/7"]
    assert "bench.fdbench run" in res["errors"]["icc_backchannel/7"]
