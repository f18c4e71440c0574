"""`python -m bench.latency` runs end to end against its own echo server and accounts for every chunk."""

from __future__ import annotations

import json

import pytest

from bench import latency

pytestmark = pytest.mark.serial  # it measures the server's added latency: run alone (Makefile, test)


def test_latency_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert latency.main(["--sessions", "1,3", "--seconds", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["sessions"] for r in report["results"]] == [1, 3]
    for row in report["results"]:
        assert row["chunks_returned"] == row["chunks_expected"] == row["sessions"] * 10
        # The echo's own delay is subtracted: what is left is positive and under one micro-turn.
        assert -1.0 < row["latency_ms_p50"] < 200.0
        assert row["missed_deadlines"] >= 0 and row["tick_lateness_ms_p99"] is not None
