"""python -m bench.reliability.fuzz: generative fuzzing of everything a client can send, with a real-time witness.

    python -m bench.reliability.fuzz --cases 100000 --seed 1 [--targets ws,dc,http,ws_conn] [--json]

Targets (cases are split between them by `--share`):
  ws       Realtime events on one WebSocket session: valid grammar with mutated fields, wrong types,
           extreme sizes and numbers, deep nesting, truncated and non-JSON text, binary frames of
           every length;
  dc       the same events on a WebRTC data channel (a real aiortc peer);
  http     the WebRTC signalling endpoints: POST /v1/realtime/calls with mutated SDP offers, content
           types and sizes around the limit; hangups of unknown calls;
  ws_conn  one WebSocket per case: text frames that are not UTF-8, client close codes, unknown resume
           tokens, odd subprotocols and beta headers.

A witness session streams audio in real time throughout (its own process) and checks that every echo
comes back within a micro-turn. The server (`--model echo`, its own subprocess on a free loopback port)
is watched for crashes: the process dying, /healthz failing, a probe that never comes back (a dead
reader or a stuck loop), a connection the server dropped, and tracebacks in its log. A case whose
grammar demands an `error` event and gets none, or a valid case that gets one, is a protocol violation.

Why Hypothesis drives it this way: cases come from `@given` with `@seed(SEED)` and a settings profile
without an example database, so a run is reproducible from `--seed` alone, and a failing case is
shrunk by Hypothesis to a minimal one. Hypothesis stops at the first failure of a run, so each run is
a *segment*: when a case fails in a new way, Hypothesis shrinks it (the same failure signature must
hold at every shrink step), the minimal case is kept, the signature becomes known (further cases that
fail the same way are counted, not shrunk again) and a new segment continues with the rest of the
budget. `strategy.example()` is not used: it is neither seeded nor shrinking.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
import warnings
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st

from bench._server import UNRETRIEVED, RemoteServer, ServerUnderTest, histogram_above, scrape
from bench.reliability._common import progress, table
from bench.reliability._fuzz_cases import Case, SessionModel, http_case, message_cases, ws_connection_case
from bench.reliability._fuzz_targets import DcTarget, HttpTarget, LoopThread, Outcome, WsConnTarget, WsTarget
from bench.reliability._witness import Witness

MAX_CASES = 2_000_000
MAX_SEGMENTS = 40  # distinct failures shrunk per target, at most
SHRINK_STEPS = 300  # cases tried while shrinking one failure, at most
SHRINK_SECONDS = 60.0
# Errors a well-formed message may get because of what earlier cases left in the session, which a case
# cannot know: typed text waiting for the next micro-turn is bounded in all (README), and the fuzz
# session's micro-turns only run when a case sends audio.
STATE_ERRORS = frozenset({"text_buffer_full"})
MAX_REPR = 300_000  # characters of a minimal case kept in the JSON report
LOG_SETTLE = 0.3  # seconds to let the server's log catch up after a case that went wrong
END_SETTLE = 3.0  # seconds after the last case by which every session must be gone (resume grace 1 s, reaps 1 s apart)
HEALTH_EVERY = 250  # cases between /healthz checks
DC_MAX_MESSAGE = 60_000  # bytes: aiortc's SCTP transport takes messages up to 64 KiB
DEFAULT_SHARE = "ws=0.90,dc=0.05,ws_conn=0.03,http=0.02"
SERVER_ARGS = ("--model", "echo", "--background", "none", "--max-frame-bytes", "65536", "--resume-grace", "1",
               "--max-sessions", "200", "--log-level", "warning")


@dataclass
class FailureRecord:
    signature: str
    target: str
    kind: str
    count: int = 0
    first_case: str = ""
    minimal_case: str = ""
    minimal_full: str = ""  # the whole minimal case (repr, up to MAX_REPR chars): the repro for the server
    outcome: str = ""


@dataclass
class TargetStats:
    cases: int = 0
    by_expect: Counter[str] = field(default_factory=Counter)
    crashes: int = 0
    violations: int = 0
    shrink_steps: int = 0
    seconds: float = 0.0


def judge(case: Case, out: Outcome, faults: list[str], dead: bool) -> list[str]:
    """Failure signatures of one case ('crash:...' or 'violation:...'); empty when it went as due."""
    sigs: list[str] = []
    if dead:
        sigs.append("crash:server_process_died")
    if faults:
        # "Traceback ... AttributeError: 'NoneType' ..." -> the exception's name is the signature
        m = re.search(r"(\w+(?:Error|Exception|Exit|Interrupt))\b(?!.*\b\w+(?:Error|Exception)\b)", faults[0])
        sigs.append(f"crash:server_log:{m.group(1) if m else 'traceback'}")
    if out.timeout:
        sigs.append("crash:no_answer" if case.target != "http" else f"crash:http_no_answer:{out.detail[:40]}")
    if case.target == "http":
        status = out.http_status or 0
        if status >= 500 and not (status == 503 and out.http_code == "server_full"):
            sigs.append(f"violation:http_{status}")
        elif status == 201 and case.expect == "error":
            sigs.append("violation:accepted_bad_offer")
        elif 400 <= status < 500 and case.expect == "ok":
            sigs.append(f"violation:refused_{out.http_code}")
        elif 400 <= status < 500 and not out.http_code:
            sigs.append(f"violation:error_without_code_{status}")
        if out.detail.startswith("hangup"):
            sigs.append("violation:hangup_of_new_call")
        return sigs
    if case.target == "ws_conn":
        if out.errors == ["server_full"]:
            return sigs  # refused for capacity (sessions dropped by earlier cases await their resume grace)
        if case.expect == "close" and out.closed != 1007:
            sigs.append(f"violation:no_1007_close:{out.closed}")
        if case.expect == "error" and not out.errors and out.http_status is None:
            sigs.append("violation:missing_error")
        return sigs
    if case.expect == "closed_1009":  # 1009, or dropped before the client read the close frame (-1)
        if out.closed is None and not out.errors:
            sigs.append(f"violation:oversized_message_not_refused:{out.closed}")
        return sigs
    if out.closed is not None:
        sigs.append(f"crash:connection_closed:{out.closed}{':told' if out.told else ''}")
    elif not out.timeout:
        if case.expect == "error" and not out.errors:
            sigs.append("violation:missing_error")
        unexpected = [e for e in out.errors if e not in STATE_ERRORS]
        if case.expect == "ok" and unexpected:
            sigs.append(f"violation:unexpected_error:{unexpected[0]}")
    return sigs


class _Found(Exception):
    """Raised inside the Hypothesis test to make it shrink a case that failed in a new way."""


class _Segment:
    """One Hypothesis run: generate until a case fails in a new way, then shrink that failure."""

    def __init__(self, fuzzer: Fuzzer, name: str, remaining: int) -> None:
        self.fuzzer, self.name, self.remaining = fuzzer, name, remaining
        self.generated = 0
        self.found: str | None = None  # the new failure signature being shrunk
        self.best: Case | None = None  # the smallest case failing that way so far
        self.out: Outcome | None = None
        self.shrinks = 0
        self.shrink_t0 = 0.0
        self.siblings: list[str] = []  # other signatures of the same failing case (one root, shrunk once)

    def test(self, case: Case) -> None:
        f, stats = self.fuzzer, self.fuzzer.stats[self.name]
        if self.found is None:
            if self.generated >= self.remaining:
                return  # Hypothesis may generate a few more than asked for; they are not run
            self.generated += 1
            f._count(self.name, case)
        else:
            self.shrinks += 1
            stats.shrink_steps += 1
            if self.shrinks > SHRINK_STEPS or time.monotonic() - self.shrink_t0 > SHRINK_SECONDS:
                return  # enough: the smallest failing case so far stands
        out, sigs = f.execute(case)
        keys = [f"{self.name}:{case.kind}:{s}" for s in sigs]
        failed = None
        if self.found is None:
            f._record(self.name, case, out, sigs)
            new = [k for k in keys if k not in f.known]
            if new:
                self.found, self.shrink_t0, self.siblings = new[0], time.monotonic(), new[1:]
                failed = self.found
        elif self.found in keys:
            failed = self.found
        if failed is not None:
            self.best, self.out = case, out
            raise _Found(failed)  # one raise site: Hypothesis tells failures apart by where they were raised


class Fuzzer:
    def __init__(self, server: ServerUnderTest, loop: LoopThread, max_frame_bytes: int, seed_: int,
                 quiet: bool = False) -> None:
        self.server = server
        self.loop = loop
        self.seed = seed_
        self.quiet = quiet
        self.max_frame_bytes = max_frame_bytes
        self.targets: dict[str, Any] = {}
        self.stats: dict[str, TargetStats] = {}
        self.failures: dict[str, FailureRecord] = {}
        self.known: set[str] = set()
        self.unretrieved: Counter[str] = Counter()  # "Task exception was never retrieved", by task and exception
        self.total = 0
        # (wall time, target, kind, size of the case's repr) of the last cases run: what ran just before
        # a late witness echo
        self.timeline: deque[tuple[float, str, str, int]] = deque(maxlen=20_000)
        self.started = time.monotonic()

    # -- one case ------------------------------------------------------------------------------

    def _target(self, name: str) -> Any:
        if name not in self.targets:
            makers = {"ws": lambda: WsTarget(self.server.ws_url), "dc": lambda: DcTarget(self.server.url),
                      "http": lambda: HttpTarget(self.server.url), "ws_conn": lambda: WsConnTarget(self.server.ws_url)}
            self.targets[name] = makers[name]()
        return self.targets[name]

    def execute(self, case: Case) -> tuple[Outcome, list[str]]:
        target = self._target(case.target)
        size = len(case.payload) if isinstance(case.payload, str | bytes) else len(str(case.payload))
        self.timeline.append((time.time(), case.target, case.kind, size))
        try:
            out = self.loop.run(target.run(case), timeout=60)
        except Exception as exc:  # the client side could not even deliver the case: the server is gone or stuck
            out = Outcome(timeout=True, detail=f"{type(exc).__name__}: {exc}"[:200])
            if hasattr(target, "reset"):
                self.loop.run(target.reset(), timeout=30)
        dead = not self.server.alive()
        if out.timeout or out.closed is not None or (out.http_status or 0) >= 500:
            time.sleep(LOG_SETTLE)  # the server logs what went wrong just after answering: keep it with this case
        faults = self.server.new_faults()
        for f in faults:
            if f.startswith(UNRETRIEVED):  # a task that died earlier, found by the garbage collector now
                self.unretrieved[f] += 1
        own = [f for f in faults if not f.startswith(UNRETRIEVED)]
        out.log = own[0][:300] if own else ""
        sigs = judge(case, out, own, dead)
        if not dead and (out.timeout or self.total % HEALTH_EVERY == 0) and not self.server.healthy(5):
            sigs.append("crash:healthz_failed")
            dead = True
        if dead:
            self.server.restart()
            for t in self.targets.values():
                if hasattr(t, "reset"):
                    self.loop.run(t.reset(), timeout=30)
        return out, sigs

    # -- Hypothesis driving --------------------------------------------------------------------

    def fuzz_target(self, name: str, strategy: st.SearchStrategy[Case], budget: int) -> None:
        stats = self.stats.setdefault(name, TargetStats())
        t0 = time.monotonic()
        for segment in range(MAX_SEGMENTS):
            if stats.cases >= budget:
                break
            seg = _Segment(self, name, budget - stats.cases)
            run = settings(max_examples=seg.remaining + 10, database=None, deadline=None, derandomize=False,
                           phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck),
                           report_multiple_bugs=False, verbosity=Verbosity.quiet, print_blob=False)(
                seed(self.seed * 1000 + segment)(given(strategy)(seg.test)))
            # _Found after shrinking, or Hypothesis' own complaint when shrinking was cut short.
            with contextlib.suppress(Exception), warnings.catch_warnings():
                # aiortc draws ICE credentials from `random` when the dc target opens a call inside the
                # test; Hypothesis warns as if a strategy had used it. The cases do not depend on it.
                warnings.filterwarnings("ignore", message="Do not use the `random` module")
                run()
            if seg.found is None or seg.best is None:
                break  # the whole budget ran (or Hypothesis ran out of distinct cases)
            for key in (seg.found, *seg.siblings):
                self.known.add(key)
                rec = self.failures[key]
                rec.minimal_case = seg.best.short(600)
                rec.minimal_full = seg.best.short(MAX_REPR)
                rec.outcome = _describe(seg.out)
            self._say(f"{name}: new failure {seg.found} (shrunk in {seg.shrinks} steps): {rec.minimal_case[:200]}")
        stats.seconds += time.monotonic() - t0

    def _count(self, name: str, case: Case) -> None:
        stats = self.stats[name]
        stats.cases += 1
        stats.by_expect[case.expect] += 1
        self.total += 1
        if self.total % 1000 == 0:
            rate = self.total / max(1e-9, time.monotonic() - self.started)
            crashes = sum(s.crashes for s in self.stats.values())
            violations = sum(s.violations for s in self.stats.values())
            self._say(f"{self.total} cases ({rate:.0f}/s): {crashes} crashes, {violations} violations, "
                      f"{self.server.restarts} server restarts")

    def _record(self, name: str, case: Case, out: Outcome, sigs: list[str]) -> None:
        stats = self.stats[name]
        if any(s.startswith("crash:") for s in sigs):
            stats.crashes += 1
        elif sigs:
            stats.violations += 1
        for s in sigs:
            key = f"{name}:{case.kind}:{s}"
            rec = self.failures.setdefault(key, FailureRecord(s, name, case.kind, first_case=case.short(200)))
            rec.count += 1

    def _say(self, msg: str) -> None:
        if not self.quiet:
            progress("bench.reliability.fuzz", msg)

    def close(self) -> None:
        for t in self.targets.values():
            try:
                self.loop.run(t.close(), timeout=15)
            except Exception as exc:  # a target left broken by a crash: nothing more to close
                self._say(f"closing a target failed: {exc!r}")


def _describe(out: Outcome | None) -> str:
    if out is None:
        return ""
    parts = [f"errors={out.errors}"] if out.errors else []
    if out.closed is not None:
        parts.append(f"closed={out.closed}{' (told)' if out.told else ''} {out.detail}".strip())
    if out.timeout:
        parts.append(f"no answer {out.detail}".strip())
    if out.http_status is not None:
        parts.append(f"http {out.http_status} {out.http_code or ''} {out.detail}".strip())
    if out.log:
        parts.append(f"server log: {out.log}")
    return "; ".join(parts) or "no error event"


def _sdp_offer(loop: LoopThread) -> str:
    """A real offer (audio + video + data channel), as browsers send; the mutations start from it."""
    async def make() -> str:
        from aiortc import RTCPeerConnection

        pc = RTCPeerConnection()
        pc.addTransceiver("audio")
        pc.addTransceiver("video")
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = str(pc.localDescription.sdp)
        await pc.close()
        return sdp

    return loop.run(make(), timeout=30)


def parse_share(text: str) -> dict[str, float]:
    share: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name not in ("ws", "dc", "http", "ws_conn"):
            raise ValueError(f"unknown target {name!r} in --share; use ws, dc, http, ws_conn")
        share[name] = float(value)
    total = sum(share.values())
    if total <= 0:
        raise ValueError("--share needs a positive weight")
    return {k: v / total for k, v in share.items() if v > 0}


def run_fuzz(cases: int, seed_: int, share: dict[str, float], url: str | None = None,
             max_frame_bytes: int = 65536, quiet: bool = False) -> dict[str, Any]:
    """The whole run; returns the report as a dict (see `main` for its table)."""
    if not 1 <= cases <= MAX_CASES:
        raise ValueError(f"--cases must be within 1..{MAX_CASES}")
    server = ServerUnderTest(*SERVER_ARGS) if url is None else RemoteServer(url)
    server.start()
    loop = LoopThread()
    metrics0 = scrape(server.url)
    witness = Witness(server.ws_url)
    witness.start()
    fuzzer = Fuzzer(server, loop, max_frame_bytes, seed_, quiet)
    t0 = time.monotonic()
    try:
        budgets = {name: max(1, round(cases * w)) for name, w in share.items()}
        for name, budget in budgets.items():
            if not quiet:
                progress("bench.reliability.fuzz", f"target {name}: {budget} cases")
            fuzzer.fuzz_target(name, _strategy(name, max_frame_bytes, loop), budget)
    finally:
        witness_report = witness.finish()
        fuzzer.close()
        # Every session the fuzz opened has ended or awaits its resume grace (1 s): none may be left
        # END_SETTLE s after the last case. Polled, so a run whose sessions are gone sooner ends sooner.
        settle_until = time.monotonic() + END_SETTLE
        held = server.sessions_held()
        while held != 0 and time.monotonic() < settle_until:
            time.sleep(0.1)
            held = server.sessions_held()
        faults_at_end = server.new_faults()
        metrics = scrape(server.url) if server.alive() else {}
        missed = metrics.get("duplex_missed_deadlines_total")
        for f in faults_at_end:
            if f.startswith(UNRETRIEVED):
                fuzzer.unretrieved[f] += 1
        alive = server.alive()
        exit_code, exit_s = server.terminate(20)
        loop.close()
    return {
        "benchmark": "fuzz", "seed": seed_, "cases_requested": cases,
        "cases_run": fuzzer.total, "seconds": round(time.monotonic() - t0, 1),
        "crashes": sum(s.crashes for s in fuzzer.stats.values()),
        "violations": sum(s.violations for s in fuzzer.stats.values()),
        "server_restarts": server.restarts,
        "server_alive_at_end": alive,
        "sessions_held_at_end": held,
        "server_exit_code": exit_code, "server_exit_seconds": round(exit_s, 2),
        "log_faults_at_end": [f for f in faults_at_end if not f.startswith(UNRETRIEVED)][:5],
        # Tasks that died and that nobody awaited: logged when collected, so not tied to one case.
        "unretrieved_task_exceptions": dict(fuzzer.unretrieved),
        "witness": witness_report,
        # The witness is the only real-time session: the server's own count of its late micro-turns.
        "server_missed_deadlines": missed,
        # Times the server's event loop was held past a micro-turn (its 100 ms lag probe, and collections).
        "server_loop_lag_over_200ms": histogram_above(metrics, metrics0, "duplex_event_loop_lag_seconds", "0.2")
        if metrics else None,
        # For each late echo: the cases that ran in the second before it arrived (a case that stalls
        # the server shows up here every time; a busy machine does not).
        "late_context": [{"at": round(t, 2), "added_ms": ms,
                          "cases_before": [f"{tg}:{k}({n})" for (ct, tg, k, n) in fuzzer.timeline
                                           if t - 1.0 <= ct <= t][-12:]}
                         for t, ms in witness_report.get("late_at", [])],
        "targets": {k: {**asdict(v), "by_expect": dict(v.by_expect), "seconds": round(v.seconds, 1)}
                    for k, v in fuzzer.stats.items()},
        "failures": [asdict(f) for f in sorted(fuzzer.failures.values(), key=lambda f: -f.count)],
    }


def _strategy(name: str, max_frame_bytes: int, loop: LoopThread) -> st.SearchStrategy[Case]:
    if name == "ws":
        return message_cases(SessionModel("ws", max_frame_bytes), "ws")
    if name == "dc":
        return message_cases(SessionModel("dc", max_frame_bytes), "dc").filter(
            lambda c: len(c.payload if isinstance(c.payload, bytes) else c.payload.encode()) <= DC_MAX_MESSAGE)
    if name == "ws_conn":
        return ws_connection_case()
    return http_case(_sdp_offer(loop))


def ok(report: dict[str, Any]) -> bool:
    w = report["witness"]
    return (report["crashes"] == 0 and report["violations"] == 0 and not w.get("error")
            and not report["unretrieved_task_exceptions"] and not report["log_faults_at_end"]
            # A late echo that the witness's own stalled loop explains is the machine's, not the server's.
            and w.get("missed", 1) == 0 and w.get("late", 1) - w.get("late_while_witness_stalled", 0) == 0
            and report["sessions_held_at_end"] == 0
            and report["server_exit_code"] in (0, None))  # None: a server given by --url is not stopped


def print_report(report: dict[str, Any]) -> None:
    rows = [{"target": k, "cases": v["cases"], "error due": v["by_expect"].get("error", 0),
             "ok due": v["by_expect"].get("ok", 0), "either": v["by_expect"].get("either", 0),
             "crashes": v["crashes"], "violations": v["violations"], "shrink steps": v["shrink_steps"],
             "seconds": v["seconds"]} for k, v in report["targets"].items()]
    print(table(rows, ["target", "cases", "error due", "ok due", "either", "crashes", "violations", "shrink steps",
                       "seconds"]))
    w = report["witness"]
    print(f"\nwitness: sent {w.get('sent')} returned {w.get('returned')} missed {w.get('missed')} late {w.get('late')}"
          f" (of them while its own loop stalled: {w.get('late_while_witness_stalled')}) added p50/p99/max "
          f"{w.get('added_ms_p50')}/{w.get('added_ms_p99')}/{w.get('added_ms_max')} ms; server loop held past a "
          f"micro-turn {report.get('server_loop_lag_over_200ms')} times"
          f"{' ' + str(w.get('error')) if w.get('error') else ''}")
    print(f"sessions held at the end: {report['sessions_held_at_end']}")
    for what, n in report["unretrieved_task_exceptions"].items():
        print(f"{n} x {what} (a task died unawaited; logged when collected, so not tied to one case)")
    print(f"cases run {report['cases_run']} in {report['seconds']} s (seed {report['seed']}); crashes "
          f"{report['crashes']}, violations {report['violations']}, server restarts {report['server_restarts']}, "
          f"server exit {report['server_exit_code']} after SIGTERM")
    if report["failures"]:
        print("\nfailures (count, signature, minimal case after shrinking -> what the server did):")
        for f in report["failures"]:
            print(f"- {f['count']:>6}  {f['target']}:{f['kind']}:{f['signature']}")
            if f["minimal_case"]:
                print(f"          minimal: {f['minimal_case']}")
                print(f"          server:  {f['outcome']}")
            else:
                print(f"          example: {f['first_case']}")
    print("\nPASS" if ok(report) else "\nFAIL")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.reliability.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000, help="cases to run in all")
    ap.add_argument("--seed", type=int, default=1, help="Hypothesis seed: the same seed runs the same cases")
    ap.add_argument("--share", default=DEFAULT_SHARE, help=f"cases per target (default {DEFAULT_SHARE})")
    ap.add_argument("--url", default=None,
                    help="fuzz a running server (http://127.0.0.1:PORT) instead of starting one; start it as "
                    "`duplex serve " + " ".join(SERVER_ARGS) + "` (the cases assume those limits)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    try:
        share = parse_share(args.share)
        report = run_fuzz(args.cases, args.seed, share, url=args.url)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report["ok"] = ok(report)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_report(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
