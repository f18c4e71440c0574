"""bench.engine_scaling: generic over registry models; ages and the re-prefill baseline where the model has them."""

import json

import pytest

from bench.engine_scaling import main
from tests.models.test_interaction_core import one_thread  # noqa: F401 - fixture


def test_engine_bench_on_echo_reports_what_it_cannot_measure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "echo", "--sessions", "1,3", "--ages", "0,50", "--steps", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(p["sessions"], p["age"]) for p in report["points"]] == [(1, 0), (3, 0)]
    assert any("ages > 0 not supported" in n for n in report["notes"])
    assert any("no re-prefill baseline" in n for n in report["notes"])
    assert report["sessions_in_budget"]["default/age0"]["measured_max"] == 3


def test_engine_bench_on_native_tiny_ages_and_baseline(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUPLEX_TORCH_THREADS", "1")
    args = ["--model", "native:tiny", "--sessions", "1", "--ages", "0,40", "--steps", "2", "--warmup", "1", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kv_bytes_per_session"] > 0 and report["notes"] == []
    assert {(p["age"], p["mode"]) for p in report["points"]} == {(0, "deterministic"), (40, "deterministic")}
    base = {b["age"]: b["ms_one_session"] for b in report["baseline"]}
    # Re-prefilling 41 micro-turns must cost clearly more than re-prefilling one.
    assert base[40] > 5 * base[0], base
    assert "deterministic/1" in report["age_cost_ratio"]
    # FLOPs are counted per point: the older session attends to more written keys.
    flops = {p["age"]: p["gflop"] for p in report["points"]}
    assert 0 < flops[0] < flops[40], flops
    assert all(p["cpu_ms"] > 0 and p["gflops"] > 0 for p in report["points"])
