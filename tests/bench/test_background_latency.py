"""`python -m bench.background_latency` runs end to end (tiny settings) and reports every figure it promises."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp", reason="the benchmark measures the embedded llama.cpp reasoner")

from bench import background_latency

pytestmark = pytest.mark.serial  # it measures the reasoner's latency beside the micro-turns: run alone (Makefile, test)


def test_bench_background_json(capsys: pytest.CaptureFixture[str]) -> None:
    background_latency.main(["--json", "--requests", "1", "--max-tokens", "8", "--baseline", "1.0", "--fg-ms", "20"])
    result = json.loads(capsys.readouterr().out)
    assert result["alone"]["model"].startswith("llamacpp:") and result["alone"]["load_s"] > 0
    (ours,) = result["configs"]
    assert ours["llama_threads"] == 1 and ours["nice"] == 10
    assert ours["requests_timed_out"] == 0
    assert ours["delegate_to_first_token_generated_ms"]["n"] == 1
    assert ours["delegate_to_first_token_in_tickinput_ms"]["n"] == 1, "the answer never reached a TickInput"
    # The foreground can only see the token at a micro-turn after it was generated.
    assert (ours["delegate_to_first_token_in_tickinput_ms"]["p50"]
            >= ours["delegate_to_first_token_generated_ms"]["p50"])
    assert ours["tick_lateness_ms"]["alone"]["n"] >= 2 and ours["tick_lateness_ms"]["with_background"]["n"] >= 1
    assert ours["ticks"] > 3
