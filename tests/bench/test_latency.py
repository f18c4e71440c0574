"""`python -m bench.latency` runs end to end against its own echo server and accounts for every chunk."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from bench import latency
from bench._server import local_server

pytestmark = pytest.mark.serial  # it measures the server's added latency: run alone (Makefile, test)


@pytest.fixture(scope="module")
def echo1() -> Iterator[str]:
    """An echo:1 server as `bench.latency` starts its own (a start is seconds on a busy machine), for the
    tests after the first, which passes no --url: the bench's own server is tested there."""
    with local_server("--model", "echo:1", "--max-sessions", "16", "--background", "none") as url:
        yield url


def test_latency_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert latency.main(["--sessions", "1,3", "--seconds", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["sessions"] for r in report["results"]] == [1, 3]
    for row in report["results"]:
        assert row["chunks_returned"] == row["chunks_expected"] == row["sessions"] * 10
        # The echo's own delay is subtracted: what is left is positive and under one micro-turn.
        assert -1.0 < row["latency_ms_p50"] < 200.0
        assert row["missed_deadlines"] >= 0 and row["tick_lateness_ms_p99"] is not None


def test_latency_bench_measures_both_protocols_alternately(echo1: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--protocol realtime,live`: one server, one run, a row per (protocol, sessions), every chunk of
    each protocol's rounds echoed back through its own wire."""
    assert latency.main(["--sessions", "2", "--seconds", "2", "--protocol", "realtime,live", "--rounds", "2",
                         "--url", echo1, "--json"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["protocols"] == ["realtime", "live"] and report["rounds"] == 2
    assert [(r["protocol"], r["sessions"]) for r in report["results"]] == [("realtime", 2), ("live", 2)]
    for row in report["results"]:
        # Two rounds of 1 s each: 10 chunks a session in all, byte-exact through either protocol.
        assert row["chunks_returned"] == row["chunks_expected"] == row["sessions"] * 10, row
        assert -1.0 < row["latency_ms_p50"] < 200.0
        assert row["tick_lateness_ms_p99"] is not None and row["server_turnaround_ms_p50"] is not None
    # Alternating: the second round starts with the protocol that went last.
    rounds = [line.split("] ")[1].split(":")[0] for line in out.err.splitlines() if line.startswith("[bench.latency]")]
    assert rounds == ["2 session(s), realtime, round 1/2", "2 session(s), live, round 1/2",
                      "2 session(s), live, round 2/2", "2 session(s), realtime, round 2/2"]


def test_latency_bench_one_protocol_keeps_its_shape(echo1: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert latency.main(["--sessions", "1", "--seconds", "1", "--protocol", "live", "--url", echo1]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:2] == ["protocol", "sessions"]
    assert table[1].split()[:3] == ["live", "1", "5/5"]


@pytest.mark.parametrize("bad", ["webrtc", "live,live", ""])
def test_latency_bench_refuses_an_unknown_protocol(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        latency.main(["--protocol", bad])
    assert exit_info.value.code == 2 and "--protocol takes realtime or live" in capsys.readouterr().err
