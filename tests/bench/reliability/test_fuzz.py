"""bench.reliability.fuzz: 3,000 generated cases against a real echo server must find nothing.

The full run (100,000 cases) is run by hand (`python -m bench.reliability.fuzz --cases 100000`); this is the
short version CI runs.
A failure prints the minimal (shrunk) cases, which are the repros for the server.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, seed, settings

from bench.reliability import fuzz
from bench.reliability._fuzz_cases import Case, SessionModel, message_cases
from bench.reliability._fuzz_targets import Outcome


def _generate(n: int, seed_: int) -> list[str]:
    seen: list[str] = []

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @seed(seed_)
    @given(message_cases(SessionModel("ws", 65536), "ws"))
    def collect(case: Case) -> None:
        seen.append(repr(case.payload)[:200])

    collect()
    return seen


def test_same_seed_same_cases_and_every_case_has_an_expectation() -> None:
    first, again, other = _generate(60, 7), _generate(60, 7), _generate(60, 8)
    assert first == again, "a seed must reproduce its cases exactly"
    assert first != other


def test_judge_names_crashes_and_violations() -> None:
    bad = Case("ws", "not_json", "{", "error")
    good = Case("ws", "event", json.dumps({"type": "response.create"}), "ok")
    assert fuzz.judge(bad, Outcome(errors=["invalid_json"]), [], False) == []
    assert fuzz.judge(bad, Outcome(), [], False) == ["violation:missing_error"]
    assert fuzz.judge(good, Outcome(errors=["x"]), [], False) == ["violation:unexpected_error:x"]
    assert fuzz.judge(good, Outcome(closed=1011), [], False) == ["crash:connection_closed:1011"]
    assert fuzz.judge(good, Outcome(timeout=True), [], False) == ["crash:no_answer"]
    assert fuzz.judge(good, Outcome(), ["Traceback (most recent call last): RecursionError"], True)[:2] == [
        "crash:server_process_died", "crash:server_log:RecursionError"]
    http = Case("http", "offer", {"ctype": "application/sdp", "body": "v=0"}, "either")
    assert fuzz.judge(http, Outcome(http_status=500), [], False) == ["violation:http_500"]
    assert fuzz.judge(http, Outcome(http_status=400, http_code="invalid_sdp"), [], False) == []


def test_short_fuzz_run_finds_no_fault() -> None:
    # 800 cases (~8 s here) keep the suite under its 12 minutes; `python -m bench.reliability.fuzz` runs long ones.
    report = fuzz.run_fuzz(800, seed_=1, share=fuzz.parse_share(fuzz.DEFAULT_SHARE), quiet=True)
    assert report["cases_run"] >= 360, report["targets"]
    assert set(report["targets"]) == {"ws", "dc", "http", "ws_conn"}
    failures = "\n".join(f"{f['count']} x {f['target']}:{f['kind']}:{f['signature']}\n  minimal: "
                         f"{f['minimal_case'][:400]}\n  server: {f['outcome']}" for f in report["failures"])
    assert report["crashes"] == 0 and report["violations"] == 0, failures
    w = report["witness"]
    assert not w.get("error") and w["sent"] > 0, w
    assert w["missed"] == 0 and w["late"] == 0, w
    assert report["sessions_held_at_end"] == 0, "sessions the fuzz opened are still held by the server"
    assert report["server_exit_code"] == 0
