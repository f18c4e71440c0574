"""python -m bench.reliability.soak: N real-time sessions for M minutes, with clients coming, dropping and going.

    python -m bench.reliability.soak --model echo --sessions 8 --minutes 30 [--seed 1] [--json]

Each of N client slots streams 200 ms of audio per micro-turn at absolute deadlines (unique random
PCM on the echo model, whose every echo is matched and timed; on the other models a TTS question and
`--gap` seconds of silence, looped, so that turns end and the model answers; `echoes_returned` then
counts the model's audio deltas). The server runs with `--background none` unless a
`--server-arg=--background=...` says otherwise (e.g. `llamacpp`, the embedded reasoner).
At random (seeded) intervals of about `--churn` seconds a slot leaves (close 1000, the session ends),
drops its connection without a close and resumes it (token in `X-Duplex-Resume-Token`; it is rotated on
every resume, so the client keeps the newest) after a short outage, or
keeps going; a slot that left opens a fresh session. Every `--sample-every` seconds the server's
RSS, open descriptors and threads (/proc/PID) and its missed deadlines (/metrics) are sampled, and
every `--rss-every` seconds (1) its RSS alone (the server and its worker processes, /proc/PID/statm).
RSS and descriptors get the slope of a least-squares line over the samples after `--warmup`: RSS over
the dense series, because a model's working memory comes and goes in bursts of tens of MB (a Whisper
call) and a line through a few hundred samples of that moves by MB per 10 min either way; a second
each, the bursts average out. The RSS slope is reported with its standard error, and beside it the
slope of a line through each minute's lowest RSS (what stays resident between bursts, where a leak
shows first); the pass/fail criterion is the least-squares slope of the whole series.

At the end every slot leaves, and descriptors and threads are compared with their values before
the first session, and so is the server's asyncio task count (`duplex_asyncio_tasks` in /metrics).

Late echoes are attributed: one that would have been on time without a stall of the soak client's own
event loop while it waited (the client shares the machine) is counted apart, beside the server's loop
lag (`duplex_event_loop_lag_seconds`) and the seconds with the most late echoes.

Passes (exit 0) when: 0 missed deadlines, 0 echoes lost or late (but for the client's stalls), RSS
slope under `--max-rss-slope` MB per 10 minutes, descriptors, threads and tasks back at their start
values, every resume succeeded, no session closed without being told why, and no traceback in the
server's log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np

from bench._server import ServerUnderTest, histogram_above, parse_metrics, scrape
from bench.reliability._common import (
    LoopLag,
    ProcSample,
    descendants,
    fit_line,
    fit_slope,
    proc_sample,
    progress,
    rss_bytes,
    table,
)
from bench.reliability._echo_client import EchoClient

MAX_SESSIONS = 256
MAX_MINUTES = 600.0
END_SETTLE = 2.0  # seconds the server is given to close the sessions that left before it is compared
LATE_MS = 200.0  # an echo later than one micro-turn past its due time is late (the clients' late_after)


@dataclass
class Sample:
    t: float  # seconds since the first session started
    rss_mb: float
    fds: int
    threads: int
    missed: int  # missed deadlines so far (since the run started)
    sessions: int  # sessions the server holds (attached or awaiting resume)
    tasks: int  # tasks alive on the server's event loop (its /metrics)
    rss_parts_mb: list[float] = field(default_factory=list)  # RSS of the server, then of each worker process


@dataclass
class SoakReport:
    model: str
    sessions: int
    minutes: float
    seed: int
    capacity: int
    sessions_opened: int = 0
    leaves: int = 0
    drops: int = 0
    resumes_ok: int = 0
    resumes_failed: int = 0
    chunks_sent: int = 0
    echoes_returned: int = 0
    echoes_missed: int = 0
    echoes_late: int = 0
    added_ms_p99: float | None = None
    missed_deadlines: int = 0
    missed_after_warmup: int = 0
    rss_start_mb: float = 0.0
    rss_end_mb: float = 0.0
    rss_slope_mb_per_10min: float | None = None
    rss_slope_second_half_mb_per_10min: float | None = None  # tells a plateau (warming allocator) from a leak
    rss_slope_se_mb_per_10min: float | None = None  # standard error of rss_slope (independent residuals assumed)
    rss_floor_slope_mb_per_10min: float | None = None  # line through each minute's lowest RSS after warm-up
    rss_points: int = 0  # RSS readings the slopes were fitted to
    fds_start: int = 0
    fds_end: int = 0
    fds_slope_per_10min: float | None = None
    threads_start: int = 0
    threads_after_warmup: int = 0
    threads_end: int = 0
    tasks_start: int = 0  # asyncio tasks on the server's loop before the first session (/metrics)
    tasks_end: int = 0  # and after every session left
    kv_slots_peak: int = 0  # sessions held at once, at most (each holds one model state / KV slot)
    untold_closes: int = 0  # sessions that ended without duplex.session.closing or a 1000 close
    # Where late echoes come from. The soak client shares the machine with the server, so its own loop
    # can be the late one: a late echo that would have been on time without a stall of this process's
    # loop while it waited is the client's, not the server's.
    late_seconds: list[dict[str, float]] = field(default_factory=list)  # the 5 seconds with most late echoes
    late_while_client_stalled: int = 0
    client_loop_lag_max_ms: float = 0.0
    client_loop_stalls_100ms: int = 0
    server_loop_probes: int = 0  # wake-ups of the server's loop-lag probe during the run
    server_loop_lag_over_100ms: int = 0  # server loop wake-ups (every 100 ms) later than 100 ms, and
    server_loop_lag_over_200ms: int = 0  # later than a micro-turn (duplex_event_loop_lag_seconds)
    server_errors: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)  # tracebacks in the server log
    # Why deadlines were missed, in the server's words: its missed-deadline and slow-step lines.
    miss_log: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    rss_series: list[tuple[float, float]] = field(default_factory=list)  # (s since start, MB) every --rss-every s
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class Slot:
    """One client seat: a chain of sessions, each ended by leave, or interrupted by drop + resume."""

    def __init__(self, index: int, ws_url: str, rng: random.Random, churn: float, delay: int,
                 speech: np.ndarray | None, report: SoakReport) -> None:
        self.index, self.ws_url, self.rng, self.churn, self.delay = index, ws_url, rng, churn, delay
        self.speech = speech
        self.report = report
        self.clients: list[EchoClient] = []

    async def run(self, until: float) -> None:
        n = 0
        while time.monotonic() < until:
            client = EchoClient(self.ws_url, seed=self.index * 100_000 + n, delay=self.delay, late_after=LATE_MS / 1000,
                                speech=self.speech)
            n += 1
            self.clients.append(client)
            if not await client.connect():
                await asyncio.sleep(1.0)  # refused (full) or failed: counted in its stats; try again
                continue
            self.report.sessions_opened += 1
            while time.monotonic() < until:
                left = until - time.monotonic()
                span = min(left, self.rng.expovariate(1.0 / self.churn))
                await client.stream(span)
                if not client.connected or time.monotonic() >= until:
                    break
                action = self.rng.choices(["leave", "drop", "stay"], weights=[1, 2, 1])[0]
                if action == "leave":
                    await client.settle(0.5)
                    await client.leave()
                    self.report.leaves += 1
                    break
                if action == "drop":
                    await client.drop()
                    self.report.drops += 1
                    await asyncio.sleep(self.rng.uniform(0.2, 2.0))  # the outage, well inside the grace
                    if not await client.connect(resume=True):
                        break
            if client.connected:  # the run is over: say goodbye
                await client.settle(1.0)
                await client.leave()
            elif not client.stats.missed:
                await client.settle(0.0)  # the connection died under us: whatever is pending was lost
            await asyncio.sleep(self.rng.uniform(0.0, 0.5))


async def _sampler(server_pid: int, base: str, t0: float, until: float, every: float, report: SoakReport,
                   missed0: float) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            # Off this loop: it also times the echoes, and a blocking /proc walk or HTTP round trip to a
            # busy server would be a stall of the measuring client, charged to nobody.
            s = await asyncio.to_thread(proc_sample, server_pid)
            try:
                metrics = parse_metrics((await http.get(base + "/metrics")).text)
            except httpx.HTTPError as exc:
                progress("bench.reliability.soak", f"/metrics unavailable ({exc!r}); sample skipped")
                metrics = None
            try:
                held = int((await http.get(base + "/healthz")).json().get("sessions", 0))
            except (httpx.HTTPError, ValueError):
                held = -1
            if s is not None and metrics is not None:
                sample = Sample(round(time.monotonic() - t0, 1), round(s.rss_bytes / 2**20, 2), s.fds, s.threads,
                                int(metrics.get("duplex_missed_deadlines_total", 0) - missed0), held,
                                int(metrics.get("duplex_asyncio_tasks", -1)),
                                [round(b / 2**20, 1) for b in s.rss_parts])
                report.samples.append(sample)
                report.kv_slots_peak = max(report.kv_slots_peak, held)
                progress("bench.reliability.soak", f"t={sample.t:.0f}s rss={sample.rss_mb:.1f}MB fds={sample.fds} "
                         f"threads={sample.threads} tasks={sample.tasks} sessions={held} missed={sample.missed}"
                         + (f" rss_parts={sample.rss_parts_mb}" if len(sample.rss_parts_mb) > 1 else ""))
            if time.monotonic() >= until:
                return
            await asyncio.sleep(every)


async def _rss_probe(server_pid: int, t0: float, until: float, every: float, report: SoakReport) -> None:
    """The server's RSS (with its worker processes) every `every` s: cheap reads, so the slope can be fitted
    to thousands of points. The worker list is refreshed every 10 s (workers may be restarted)."""
    pids: list[int] = []
    listed = 0.0
    while True:
        now = time.monotonic()
        if now - listed >= 10.0:
            pids, listed = [server_pid, *await asyncio.to_thread(descendants, server_pid)], now
        total = rss_bytes(pids)
        if total is not None:
            report.rss_series.append((round(now - t0, 2), round(total / 2**20, 2)))
        if now >= until:
            return
        await asyncio.sleep(every)


def _fit_rss(report: SoakReport, warmup: float) -> None:
    """The RSS slopes after `warmup` (MB per 10 min): least squares over the dense series, with its
    standard error; its second half; and the per-minute floor."""
    series = [(t, mb) for t, mb in report.rss_series if t >= warmup]
    report.rss_points = len(series)
    line = fit_line([t for t, _ in series], [mb for _, mb in series])
    if line is None:
        return
    report.rss_slope_mb_per_10min = round(line[0] * 600, 3)
    report.rss_slope_se_mb_per_10min = round(line[1] * 600, 3)
    mid = (series[0][0] + series[-1][0]) / 2
    half = [(t, mb) for t, mb in series if t >= mid]
    hslope = fit_slope([t for t, _ in half], [mb for _, mb in half])
    report.rss_slope_second_half_mb_per_10min = None if hslope is None else round(hslope * 600, 3)
    floors: dict[int, tuple[float, float]] = {}
    for t, mb in series:
        minute = int((t - series[0][0]) // 60)
        if minute not in floors or mb < floors[minute][1]:
            floors[minute] = (t, mb)
    fslope = fit_slope([t for t, _ in floors.values()], [mb for _, mb in floors.values()])
    report.rss_floor_slope_mb_per_10min = None if fslope is None else round(fslope * 600, 3)


def conversation_clip(gap: float) -> np.ndarray:
    """What a client of a talking model says, looped: a TTS question, then `gap` s of silence for the answer
    (int16 at the server's rate). Without the gap the user never yields and the model never speaks."""
    from bench.load import speech_clip
    from streaming.pcm import float32_to_pcm16
    from streaming.types import SAMPLE_RATE

    if gap < 0:
        raise ValueError(f"--gap must be >= 0 s, got {gap}")
    said = np.frombuffer(float32_to_pcm16(speech_clip(None)), "<i2")
    return np.concatenate([said, np.zeros(round(gap * SAMPLE_RATE), dtype="<i2")])


def _settled(server: ServerUnderTest, pid: int, report: SoakReport,
             wait: float) -> tuple[ProcSample | None, dict[str, float]]:
    """The server's /proc figures and /metrics once it holds no session and its descriptors, threads and
    tasks are back at their start values, or as they are after `wait` seconds (then the judge says which
    one is not). Polled, so a server that cleans up at once is compared at once."""
    deadline = time.monotonic() + wait
    while True:
        end = proc_sample(pid)
        metrics = scrape(server.url)
        clean = (end is not None and end.fds <= report.fds_start and end.threads <= report.threads_start
                 and int(metrics.get("duplex_asyncio_tasks", -1)) == report.tasks_start
                 and server.sessions_held() == 0)
        if clean or time.monotonic() >= deadline:
            return end, metrics
        time.sleep(0.1)


def soak(server: ServerUnderTest, model: str, sessions: int, minutes: float, seed: int, churn: float,
         every: float, warmup: float, max_rss_slope: float, gap: float = 4.0, rss_every: float = 1.0) -> SoakReport:
    health = server.healthz()
    capacity = int(health.get("capacity", 0))
    n = sessions or min(capacity, MAX_SESSIONS)
    if not 1 <= n <= MAX_SESSIONS:
        raise ValueError(f"--sessions must be within 1..{MAX_SESSIONS}, got {n}")
    report = SoakReport(model=model, sessions=n, minutes=minutes, seed=seed, capacity=capacity)
    delay = int(model.split(":")[1]) if model.startswith("echo:") else 1
    speech = None if model.startswith("echo") else conversation_clip(gap)
    pid = server.pid
    start = proc_sample(pid)
    assert start is not None, "server process is gone"
    report.rss_start_mb, report.fds_start, report.threads_start = round(start.rss_bytes / 2**20, 2), start.fds, \
        start.threads
    metrics0 = scrape(server.url)
    missed0 = metrics0.get("duplex_missed_deadlines_total", 0.0)
    report.tasks_start = int(metrics0.get("duplex_asyncio_tasks", -1))
    rng = random.Random(seed)
    lag = LoopLag()
    slots = [Slot(i, server.ws_url, random.Random(rng.random()), churn, delay, speech, report) for i in range(n)]

    async def run_all() -> None:
        t0 = time.monotonic()
        until = t0 + minutes * 60
        sampler = asyncio.create_task(_sampler(pid, server.url, t0, until, every, report, missed0))
        rss_probe = asyncio.create_task(_rss_probe(pid, t0, until, rss_every, report))
        lag_probe = asyncio.create_task(lag.run(until))

        async def slot_run(slot: Slot) -> None:
            await asyncio.sleep(slot.index * 0.2 / n + rng.random() * 0.5)  # spread phases like real clients
            await slot.run(until)

        await asyncio.gather(*(slot_run(s) for s in slots))
        await sampler
        await rss_probe
        await lag_probe

    t_wall0 = time.time()
    asyncio.run(run_all())
    # Every session has left with 1000; give the server a moment (up to 2 s) to close them, then compare.
    end, metrics = _settled(server, pid, report, END_SETTLE)
    report.missed_deadlines = int(metrics.get("duplex_missed_deadlines_total", 0) - missed0)
    report.tasks_end = int(metrics.get("duplex_asyncio_tasks", -1))
    after = [s for s in report.samples if s.t >= warmup]
    if after:
        report.missed_after_warmup = report.missed_deadlines - after[0].missed
        report.threads_after_warmup = after[0].threads
        fslope = fit_slope([s.t for s in after], [float(s.fds) for s in after])
        report.fds_slope_per_10min = None if fslope is None else round(fslope * 600, 3)
    _fit_rss(report, warmup)
    if end is not None:
        report.rss_end_mb, report.fds_end, report.threads_end = round(end.rss_bytes / 2**20, 2), end.fds, end.threads
    clients = [c for slot in slots for c in slot.clients]
    for c in clients:
        st = c.stats
        report.chunks_sent += st.sent
        report.echoes_returned += st.returned if speech is None else c.deltas
        report.echoes_missed += st.missed
        report.echoes_late += st.late
        report.resumes_ok += st.resumes - len(st.resume_failures)
        report.resumes_failed += len(st.resume_failures)
        report.untold_closes += st.unexpected_drops
        report.server_errors += st.errors[:3]
    added = [x for c in clients for x in c.stats.added_ms]
    _attribute_late(report, [x for c in clients for x in c.stats.late_at], lag, metrics, metrics0, t_wall0)
    report.added_ms_p99 = round(float(np.percentile(added, 99)), 1) if added else None
    report.faults = server.new_faults()
    if report.missed_deadlines:
        report.miss_log = server.log_lines("missed their deadline") + server.log_lines("slow cascade step")
    _judge(report, max_rss_slope)
    return report


def _attribute_late(r: SoakReport, late_at: list[tuple[float, float]], lag: LoopLag, metrics: dict[str, float],
                    metrics0: dict[str, float], t_wall0: float) -> None:
    """Where the late echoes were (the busiest seconds) and whose loop was stalled meanwhile."""
    per_second: dict[int, int] = {}
    for t, _ in late_at:
        per_second[int(t - t_wall0)] = per_second.get(int(t - t_wall0), 0) + 1
    r.late_seconds = [{"t": t, "late": n} for t, n in sorted(per_second.items(), key=lambda kv: -kv[1])[:5]]
    # The client's: the echo would not have been late without the stall its own loop had while it waited.
    r.late_while_client_stalled = lag.explained(late_at, LATE_MS)
    r.client_loop_lag_max_ms = round(lag.max_ms, 1)
    r.client_loop_stalls_100ms = sum(ms >= 100.0 for _, ms in lag.stalls)
    r.server_loop_probes = int(metrics.get("duplex_event_loop_lag_seconds_count", 0)
                               - metrics0.get("duplex_event_loop_lag_seconds_count", 0))
    r.server_loop_lag_over_100ms = histogram_above(metrics, metrics0, "duplex_event_loop_lag_seconds", "0.1")
    r.server_loop_lag_over_200ms = histogram_above(metrics, metrics0, "duplex_event_loop_lag_seconds", "0.2")


def _judge(r: SoakReport, max_rss_slope: float) -> None:
    f = r.failures
    if r.missed_deadlines:
        f.append(f"{r.missed_deadlines} missed deadlines")
    server_late = r.echoes_late - r.late_while_client_stalled
    if r.echoes_missed or server_late:
        f.append(f"{r.echoes_missed} echoes lost, {server_late} late (and {r.late_while_client_stalled} late "
                 "while the soak client's own loop stalled)")
    if r.rss_slope_mb_per_10min is not None and r.rss_slope_mb_per_10min >= max_rss_slope:
        f.append(f"RSS grows {r.rss_slope_mb_per_10min} MB per 10 min (limit {max_rss_slope})")
    if r.fds_end > r.fds_start:  # fewer is fine: the start can include a client's keep-alive connection
        f.append(f"open descriptors {r.fds_start} at start, {r.fds_end} at the end")
    if r.threads_end > max(r.threads_start, r.threads_after_warmup):
        f.append(f"threads {r.threads_start} at start ({r.threads_after_warmup} after warm-up), {r.threads_end} "
                 "at the end")
    if r.tasks_end != r.tasks_start:
        f.append(f"asyncio tasks {r.tasks_start} at start, {r.tasks_end} at the end")
    if r.resumes_failed:
        f.append(f"{r.resumes_failed} resumes failed")
    if r.untold_closes:
        f.append(f"{r.untold_closes} sessions closed without being told why")
    if r.server_errors:
        f.append(f"error events: {r.server_errors[:3]}")
    if r.faults:
        f.append(f"server log: {r.faults[:3]}")


def _print(r: SoakReport) -> None:
    skip = ("samples", "rss_series", "failures", "server_errors", "faults", "miss_log")
    row = {k: v for k, v in asdict(r).items() if k not in skip}
    print(table([{"figure": k, "value": v} for k, v in row.items()], ["figure", "value"]))
    for line in r.miss_log:
        print("  server:", line)
    print("PASS" if r.ok else "FAIL: " + "; ".join(r.failures))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.reliability.soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="echo", help="echo, echo:N, cascade or native:tiny (server --model)")
    ap.add_argument("--sessions", type=int, default=0,
                    help="client slots (default: the server's rated capacity from /healthz, at most 256)")
    ap.add_argument("--minutes", type=float, default=1.0, help="how long the sessions stream")
    ap.add_argument("--seed", type=int, default=1, help="seed of the clients' random behaviour and audio")
    ap.add_argument("--churn", type=float, default=20.0, help="mean seconds between a slot's leave/drop/stay choices")
    ap.add_argument("--gap", type=float, default=4.0,
                    help="models other than echo: seconds of silence after each spoken question, for the answer")
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS/fds/threads samples")
    ap.add_argument("--rss-every", type=float, default=1.0,
                    help="seconds between the RSS-only readings the RSS slope is fitted to")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds excluded from the fitted slopes (default: a fifth of the run, at most 120)")
    ap.add_argument("--max-rss-slope", type=float, default=1.0, help="failing RSS slope, MB per 10 minutes")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for `duplex serve` (repeatable, e.g. --server-arg=--max-sessions=8)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    if not 0 < args.minutes <= MAX_MINUTES:
        print(f"error: --minutes must be within (0, {MAX_MINUTES:.0f}]", file=sys.stderr)
        return 2
    if args.sample_every <= 0 or args.rss_every <= 0:
        print("error: --sample-every and --rss-every must be positive seconds", file=sys.stderr)
        return 2
    warmup = args.warmup if args.warmup is not None else min(120.0, args.minutes * 60 / 5)
    progress("bench.reliability.soak", f"starting duplex serve --model {args.model} ...")
    server_args = ["--model", args.model, "--background", "none", "--log-level", "warning", *args.server_arg]
    with ServerUnderTest(*server_args) as server:
        report = soak(server, args.model, args.sessions, args.minutes, args.seed, args.churn, args.sample_every,
                      warmup, args.max_rss_slope, args.gap, args.rss_every)
        progress("bench.reliability.soak", f"{report.sessions} slots x {args.minutes} min done; stopping the server")
    if args.json:
        out = asdict(report)
        out["ok"] = report.ok
        print(json.dumps(out, indent=2))
    else:
        _print(report)
    return 0 if report.ok else 1


def summary(r: SoakReport) -> dict[str, Any]:
    """The figures without the samples (for tests and logs)."""
    return {k: v for k, v in asdict(r).items() if k not in ("samples", "rss_series")}


if __name__ == "__main__":
    sys.exit(main())
