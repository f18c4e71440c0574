"""bench.load: a short bounded trial against a real echo server, and its pure helpers."""

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from bench import load


def test_refuses_non_loopback_targets() -> None:
    assert load.check_loopback("ws://127.0.0.1:8000/v1/realtime") == "127.0.0.1"
    assert load.check_loopback("ws://localhost:8000/v1/realtime") == "localhost"
    for url in ("ws://10.0.0.5:8000/v1/realtime", "ws://example.com/v1/realtime"):
        with pytest.raises(ValueError, match="only targets this machine"):
            load.check_loopback(url)
    assert load.main(["--url", "ws://192.168.1.2:8000/v1/realtime"]) == 2


def test_bucket_quantile_interpolates_like_promql() -> None:
    # 10 observations: 5 in (0, 1 ms], 5 in (1 ms, 2 ms].
    buckets = {0.001: 5.0, 0.002: 10.0, float("inf"): 10.0}
    assert load.bucket_quantile(buckets, 0.5) == pytest.approx(0.001)
    assert load.bucket_quantile(buckets, 0.75) == pytest.approx(0.0015)
    assert load.bucket_quantile({0.001: 0.0, float("inf"): 0.0}, 0.5) is None


def test_trial_against_echo_server(duplex_server: Callable[..., Any]) -> None:
    server = duplex_server("--model", "echo")
    t = np.arange(24000 * 2) / 24000
    speech = (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    res = load.trial(server.ws_url, sessions=2, seconds=2.0, speech=speech, ramp=0.2)
    assert res.errors == 0 and res.refused == 0, res.error_samples
    # 2 sessions x 10 micro-turns were stepped in real time, and the echo answered them.
    assert res.ticks_realtime >= 20
    assert res.deltas_received >= 16
    assert res.lateness_p50_ms is not None and res.rss_after_mb is not None


def test_trial_sends_the_api_key(duplex_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    server = duplex_server("--model", "echo", env={"DUPLEX_API_KEY": "k3y"})
    speech = np.full(4800, 0.1, np.float32)
    monkeypatch.setenv("DUPLEX_API_KEY", "k3y")
    res = load.trial(server.ws_url, sessions=1, seconds=1.0, speech=speech, ramp=0.0)
    assert res.errors == 0 and res.deltas_received >= 3, res.error_samples
    monkeypatch.setenv("DUPLEX_API_KEY", "wrong")
    with pytest.raises(RuntimeError, match="/metrics answered 401"):
        load.trial(server.ws_url, sessions=1, seconds=1.0, speech=speech, ramp=0.0)
