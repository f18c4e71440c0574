"""python -m bench.reliability.chaos: faults injected while real-time sessions stream, and what they leave behind.

    python -m bench.reliability.chaos [--scenarios backend_killed,...] [--bystanders 4] [--json]

Every scenario starts its own `duplex serve --model echo --background openai` pointed at a scripted
OpenAI-compatible backend (bench/reliability/_chaos_backend.py, its own process), starts `--bystanders` real-time
sessions whose every echo is timed, injects one fault, and checks:

  - the other sessions are unaffected: no bystander echo lost or later than a micro-turn, and no
    missed deadline in the server's /metrics during the scenario (a late echo that a stall of the
    measuring process's own event loop explains is counted apart, as the machine's: see LoopLag);
  - every session that was closed was told why (`duplex.session.closing`, a close code);
  - nothing acknowledged is lost (a background request that was `started` ends with `done` or
    `error`; typed text acknowledged by `conversation.item.added` comes back after a resume);
  - no traceback in the server's log, and the process exits 0 within the drain time after SIGTERM.

Scenarios:
  backend_killed     the backend process is SIGKILLed in the middle of a streamed answer
  backend_slow       the backend streams slower than the server's background timeout
  backend_garbage    the backend sends lines that are not JSON, not SSE and not UTF-8 mid-stream
  client_drop        a client vanishes without a close right after typed text was acknowledged, and resumes
                     (the token it used must be refused afterwards: tokens rotate on every resume)
  client_never_reads a client sends and never reads, until the server's buffers for it are full
  sigterm            SIGTERM while every session streams and a background answer is running
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bench._server import ROOT, ServerUnderTest, free_port, histogram_above, scrape
from bench.reliability._common import LoopLag, proc_sample, progress, table
from bench.reliability._echo_client import EchoClient
from bench.reliability._never_reader import NeverReader
from server.limits import DEFAULT_OUTBOX_BYTES, MAX_INSTRUCTIONS_CHARS

DRAIN_SECONDS = 15.0  # SIGTERM to exit: uvicorn's graceful shutdown (10 s) plus margin
BACKGROUND_TIMEOUT = 3.0  # the server's --background-timeout in these scenarios (the [slow] answer takes 20 s)
RESUME_GRACE = 3.0
SCENARIOS = ("backend_killed", "backend_slow", "backend_garbage", "client_drop", "client_never_reads", "sigterm")


@dataclass
class ScenarioResult:
    name: str
    bystander_echoes: int = 0
    bystander_missed: int = 0
    bystander_late: int = 0  # the server's: late echoes the bench's own loop stalls do not explain
    bystander_late_client: int = 0  # late while this bench's own loop stalled (a busy machine, not the fault)
    client_loop_lag_max_ms: float = 0.0
    server_loop_stalls_200ms: int | None = None  # the server's loop-lag probe past a micro-turn (None: not scraped)
    bystander_max_added_ms: float = 0.0
    missed_deadlines: int = 0
    told: str = ""  # what the affected session was told
    lost: int = 0  # acknowledged things that never arrived
    exit_code: int | None = None
    exit_seconds: float = 0.0
    faults: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


class Backend:
    """The scripted backend process; `kill` is a real SIGKILL."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.reliability._chaos_backend", str(self.port)],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("the scripted backend did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@dataclass
class Ctx:
    server: ServerUnderTest
    backend: Backend
    result: ScenarioResult
    bystanders: list[EchoClient]
    missed0: float  # the server's missed deadlines when the scenario started


def _is(etype: str, **fields: Any) -> Callable[[dict[str, Any]], bool]:
    return lambda ev: ev.get("type") == etype and all(ev.get(k) == v for k, v in fields.items())


async def _victim(ctx: Ctx, seed: int) -> tuple[EchoClient, asyncio.Task[None]]:
    v = EchoClient(ctx.server.ws_url, seed=seed)
    if not await v.connect():
        raise RuntimeError(f"the victim session could not connect: {v.stats.errors}")
    return v, asyncio.create_task(v.stream())


async def _background_fault(ctx: Ctx, marker: str, inject: Callable[[], None] | None) -> None:
    """A background request whose stream meets `marker`'s fault; it must end with done or error, and the
    session must still get answers afterwards."""
    r = ctx.result
    v, streaming = await _victim(ctx, 900)
    await v.send_event({"type": "duplex.background.request", "query": f"please answer {marker}"})
    started = await v.wait_event(_is("duplex.background.started"), 10)
    if started is None:
        r.failures.append("the background request was never started")
        return
    rid = started.get("request_id")
    if inject is not None:
        first = await v.wait_event(_is("duplex.background.delta", request_id=rid), 10)
        if first is None:
            r.failures.append("no background delta arrived before the fault")
        inject()
    end = await v.wait_event(lambda ev: ev.get("type") in ("duplex.background.done", "duplex.background.error")
                             and ev.get("request_id") == rid, BACKGROUND_TIMEOUT + 10)
    if end is None:
        r.lost += 1
        r.failures.append(f"the started background request {rid} never ended (no done, no error)")
    else:
        r.told = f"{end['type']} {json.dumps(end.get('error') or end.get('status'))[:160]}"
    if ctx.backend.proc is None or ctx.backend.proc.poll() is not None:
        ctx.backend.start()  # the backend comes back: the session must be able to use it again
    mark = len(v.events)
    await v.send_event({"type": "duplex.background.request", "query": "and now a plain question"})
    again = await v.wait_event(_is("duplex.background.done"), 15, start=mark)
    if again is None:
        r.failures.append("after the fault the session's next background request did not complete")
    v.stop.set()
    await streaming
    await v.settle(1.0)
    if v.stats.missed or v.stats.late:
        r.failures.append(f"the victim's own audio suffered: {v.stats.missed} echoes lost, {v.stats.late} late")
    await v.leave()


async def backend_killed(ctx: Ctx) -> None:
    await _background_fault(ctx, "[long]", ctx.backend.kill)


async def backend_slow(ctx: Ctx) -> None:
    await _background_fault(ctx, "[slow]", None)


async def backend_garbage(ctx: Ctx) -> None:
    await _background_fault(ctx, "[garbage]", None)


async def client_drop(ctx: Ctx, rounds: int = 3) -> None:
    """Typed text acknowledged, then the connection vanishes; after a resume the text must come back."""
    r = ctx.result
    v, streaming = await _victim(ctx, 901)
    markers = []
    for i in range(rounds):
        marker = f"marker{i}x{int(time.time() * 1000) % 100000}"
        mark = len(v.events)
        await v.send_event({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": marker}]}})
        ack = await v.wait_event(_is("conversation.item.added"), 5, start=mark)
        if ack is None:
            r.failures.append(f"typed text {marker!r} was never acknowledged")
            continue
        markers.append(marker)
        await asyncio.sleep(0.07 * i)  # drop right after the ack, or a little later
        await v.drop()
        await streaming
        await asyncio.sleep(0.5)  # the outage
        old_token = v.resume_token
        if not await v.connect(resume=True):
            r.failures.append(f"resume {i} failed: {v.stats.resume_failures or v.stats.errors}")
            return
        streaming = asyncio.create_task(v.stream())
        if v.resume_token == old_token:
            r.failures.append(f"resume {i}: the resume token was not rotated")
        elif not await _stale_token_refused(ctx, old_token):
            r.failures.append(f"resume {i}: the token used to resume still works (it must be rotated)")
        await asyncio.sleep(0.6)
    await asyncio.sleep(0.6)
    said = " ".join(v.stats.transcripts)
    lost = [m for m in markers if m not in said]
    r.lost += len(lost)
    if lost:
        r.failures.append(f"acknowledged typed text never came back after the resume: {lost}")
    if v.stats.resume_failures:
        r.failures.append(f"resumes answered wrongly: {v.stats.resume_failures}")
    r.told = f"{v.stats.resumes} resumes, same session each time: {not v.stats.resume_failures}"
    v.stop.set()
    await streaming
    await v.leave()


async def _stale_token_refused(ctx: Ctx, token: str | None) -> bool:
    """A resume with a token that was already used is refused (invalid_resume_token), not served."""
    thief = EchoClient(ctx.server.ws_url, seed=0)
    thief.resume_token = token
    if await thief.connect(resume=True):
        await thief.leave()
        return False
    return thief.stats.resume_failures == ["invalid_resume_token"]


async def client_never_reads(ctx: Ctx) -> None:
    """A client that sends and never reads: the server must close it, say why, free its slot, stay small."""
    r = ctx.result
    pid = ctx.server.pid
    rss0 = proc_sample(pid)
    held0 = ctx.server.sessions_held()
    loop = asyncio.get_running_loop()
    cut_key = 'duplex_dropped_events_total{reason="outbox_full"}'  # counts the events dropped when it cuts one
    cuts0 = scrape(ctx.server.url).get(cut_key, 0.0)
    waited: list[float] = []

    def flood() -> tuple[list[dict[str, Any]], tuple[int | None, str], int, int, Any]:
        client = NeverReader(ctx.server.ws_url, "127.0.0.1", ctx.server.port)
        sent = 0
        try:
            # Each answer (session.updated) carries the instructions back (the longest allowed): after a few
            # the socket buffers are full and the server's queue for this client grows past its byte bound
            # (twice over: a server that honours the bound must cut us); then small answered events.
            n_big = 2 * DEFAULT_OUTBOX_BYTES // MAX_INSTRUCTIONS_CHARS
            for event in [{"type": "session.update", "session": {"instructions": "i" * MAX_INSTRUCTIONS_CHARS}}] \
                    * n_big + [{"type": "input_audio_buffer.commit"}] * 2500:
                if not client.send(event):
                    break  # the server stopped reading from us: it may have given up on us, as it should
                sent += 1
            # Seconds for the server to see that we do not read: it is done once it has cut us (its
            # counter of events dropped for a full outbox moves), else it is judged after 3 s.
            flooded = time.monotonic()
            while time.monotonic() < flooded + 3.0 and scrape(ctx.server.url).get(cut_key, 0.0) <= cuts0:
                time.sleep(0.1)
            waited.append(time.monotonic() - flooded)
            rss = proc_sample(pid)
            closing, code, count = client.drain()
            return closing, (code, client.close_reason), count, sent, rss
        finally:
            client.close()

    closing, (code, reason), received, sent, rss1 = await loop.run_in_executor(None, flood)
    if rss0 is not None and rss1 is not None:
        r.notes.append(f"server RSS {rss0.rss_bytes / 2**20:.0f} -> {rss1.rss_bytes / 2**20:.0f} MB while it "
                       "held the unread events")
    r.notes.append(f"the client sent {sent} events and read {received} once it started reading"
                   + (f" (it was cut {waited[0]:.1f} s after its last send)" if waited else ""))
    # Told why: a duplex.session.closing event, or (the server cannot queue an event for a client whose
    # queue is full) the close frame's code and reason, which the client reads after what was queued.
    r.told = f"closing={closing[0].get('reason') if closing else None!r} close {code} {reason!r}"[:200]
    if code is None and received < sent + 2:  # + session.created and duplex.session.resume
        r.failures.append(f"the server neither closed a client that did not read nor delivered its events "
                          f"({received} of {sent + 2})")
    elif code is None:
        r.failures.append(f"the server queued {received} events for a client that read none of them for seconds "
                          f"and did not cut it (its byte bound is {DEFAULT_OUTBOX_BYTES} bytes)")
    elif not closing and not reason:
        r.failures.append(f"the non-reading client was not told why it was closed (close code {code}, no reason)")
    deadline = time.monotonic() + RESUME_GRACE + 2.0  # a detached session is reaped after its grace
    held1 = ctx.server.sessions_held()
    while held0 is not None and held1 is not None and held1 > held0 and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        held1 = ctx.server.sessions_held()
    if held0 is not None and held1 is not None and held1 > held0:
        r.failures.append(f"the non-reading client's session still holds a slot ({held0} -> {held1} sessions)")


async def sigterm(ctx: Ctx) -> None:
    """SIGTERM with every session streaming and a background answer running."""
    r = ctx.result
    v, streaming = await _victim(ctx, 902)
    await v.send_event({"type": "duplex.background.request", "query": "a long one [long]"})
    await v.wait_event(_is("duplex.background.delta"), 10)
    loop = asyncio.get_running_loop()
    before = scrape(ctx.server.url).get("duplex_missed_deadlines_total", 0.0)
    r.missed_deadlines = int(before - ctx.missed0)
    terminate = loop.run_in_executor(None, ctx.server.terminate, DRAIN_SECONDS)
    clients = [*ctx.bystanders, v]
    deadline = time.monotonic() + DRAIN_SECONDS
    while any(c.connected for c in clients) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    code, seconds = await terminate
    r.exit_code, r.exit_seconds = code, round(seconds, 2)
    untold = [i for i, c in enumerate(clients) if not c.stats.closing or 1001 not in c.stats.close_codes]
    if untold:
        r.failures.append(f"{len(untold)} of {len(clients)} sessions were not told why they closed "
                          f"(closing events: {[len(clients[i].stats.closing) for i in untold]}, close codes: "
                          f"{[clients[i].stats.close_codes for i in untold]})")
    else:
        r.told = f"all {len(clients)}: {clients[0].stats.closing[0].get('reason')!r}, close 1001"
    for c in clients:
        c.stop.set()
    await streaming


BODIES: dict[str, Callable[[Ctx], Awaitable[None]]] = {
    "backend_killed": backend_killed, "backend_slow": backend_slow, "backend_garbage": backend_garbage,
    "client_drop": client_drop, "client_never_reads": client_never_reads, "sigterm": sigterm,
}


def run_scenario(name: str, backend: Backend, n_bystanders: int) -> ScenarioResult:
    r = ScenarioResult(name)
    t0 = time.monotonic()
    server = ServerUnderTest("--model", "echo", "--background", "openai", "--background-url", backend.url,
                             "--background-model", "scripted", "--background-timeout", str(BACKGROUND_TIMEOUT),
                             "--resume-grace", str(RESUME_GRACE), "--max-sessions", "32", "--log-level", "warning")
    server.start()
    metrics0 = scrape(server.url)
    missed0 = metrics0.get("duplex_missed_deadlines_total", 0.0)
    lag = LoopLag()
    wall0 = time.time()

    async def main() -> list[EchoClient]:
        lag_probe = asyncio.create_task(lag.run(until=float("inf")))
        bystanders = [EchoClient(server.ws_url, seed=i) for i in range(n_bystanders)]
        for b in bystanders:
            if not await b.connect():
                raise RuntimeError(f"a bystander could not connect: {b.stats.errors}")
        streams = [asyncio.create_task(b.stream()) for b in bystanders]
        await asyncio.sleep(0.6)  # steady state before the fault
        try:
            await BODIES[name](Ctx(server, backend, r, bystanders, missed0))
        except Exception as exc:  # a scenario that could not run to its end is a failure, not a crash of the bench
            r.failures.append(f"scenario stopped: {type(exc).__name__}: {exc}")
        await asyncio.sleep(0.6)
        for b in bystanders:
            b.stop.set()
        await asyncio.gather(*streams)
        for b in bystanders:
            await b.settle(1.0)
            await b.leave()
        lag_probe.cancel()
        return bystanders

    try:
        bystanders = asyncio.run(main())
        if name != "sigterm":
            metrics = scrape(server.url)
            r.missed_deadlines = int(metrics.get("duplex_missed_deadlines_total", 0.0) - missed0)
            r.server_loop_stalls_200ms = histogram_above(metrics, metrics0, "duplex_event_loop_lag_seconds", "0.2")
        r.faults = server.new_faults()
        if name != "sigterm":
            code, seconds = server.terminate(DRAIN_SECONDS)
            r.exit_code, r.exit_seconds = code, round(seconds, 2)
            r.faults += server.new_faults()
    finally:
        server.close()
    r.bystander_echoes = sum(b.stats.returned for b in bystanders)
    r.bystander_missed = sum(b.stats.missed for b in bystanders)
    late_at = [x for b in bystanders for x in b.stats.late_at]
    r.bystander_late_client = lag.explained(late_at, bystanders[0].late_after * 1000) if bystanders else 0
    r.bystander_late = len(late_at) - r.bystander_late_client
    r.client_loop_lag_max_ms = round(lag.max_ms, 1)
    if r.bystander_late_client:
        r.notes.append(f"{r.bystander_late_client} bystander echoes late while this bench's own loop stalled "
                       f"(up to {r.client_loop_lag_max_ms} ms): the machine's, not counted against the server")
    r.bystander_max_added_ms = round(max((b.stats.max_added_ms for b in bystanders), default=0.0), 1)
    if name == "sigterm":
        r.bystander_missed = 0  # closed by the server on purpose: their last echoes cannot come back
    if r.bystander_missed or r.bystander_late:
        r.failures.append(f"bystanders affected: {r.bystander_missed} echoes lost, {r.bystander_late} late (the "
                          f"server's loop stalled past 200 ms {r.server_loop_stalls_200ms} times; this bench's own "
                          f"loop at most {r.client_loop_lag_max_ms} ms late; late echoes as (s into the scenario, "
                          "ms added): "
                          f"{[(round(t - wall0, 2), ms) for t, ms in late_at[:6]]})")
    if r.missed_deadlines:
        r.failures.append(f"{r.missed_deadlines} missed deadlines during the scenario")
    if r.exit_code != 0:
        r.failures.append(f"the server exited with {r.exit_code} ({r.exit_seconds} s after SIGTERM; None = killed "
                          f"after {DRAIN_SECONDS:.0f} s)")
    if r.faults:
        r.failures.append(f"server log: {r.faults[:3]}")
    r.seconds = round(time.monotonic() - t0, 1)
    return r


def run_chaos(scenarios: list[str], n_bystanders: int, quiet: bool = False) -> list[ScenarioResult]:
    backend = Backend()
    backend.start()
    results = []
    try:
        for name in scenarios:
            if not quiet:
                progress("bench.reliability.chaos", f"scenario {name} ...")
            if backend.proc is None or backend.proc.poll() is not None:
                backend.start()
            res = run_scenario(name, backend, n_bystanders)
            results.append(res)
            if not quiet:
                outcome = "ok" if res.ok else "FAILED: " + "; ".join(res.failures)
                progress("bench.reliability.chaos", f"scenario {name}: {outcome}")
    finally:
        backend.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.reliability.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, from: " + ", ".join(SCENARIOS))
    ap.add_argument("--bystanders", type=int, default=4, help="real-time sessions streaming through every fault")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    names = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown or not 0 <= args.bystanders <= 64:
        print(f"error: unknown scenarios {unknown} (use {', '.join(SCENARIOS)}), bystanders must be 0..64",
              file=sys.stderr)
        return 2
    results = run_chaos(names, args.bystanders)
    if args.json:
        print(json.dumps({"benchmark": "chaos", "bystanders": args.bystanders,
                          "scenarios": [{**asdict(r), "ok": r.ok} for r in results]}, indent=2))
    else:
        rows = [{"scenario": r.name, "ok": "yes" if r.ok else "NO", "bystander echoes": r.bystander_echoes,
                 "lost/late": f"{r.bystander_missed}/{r.bystander_late}+{r.bystander_late_client}",
                 "max added ms": r.bystander_max_added_ms,
                 "missed deadlines": r.missed_deadlines, "acked lost": r.lost,
                 "exit": f"{r.exit_code} in {r.exit_seconds}s", "told": r.told[:70]} for r in results]
        print(table(rows, ["scenario", "ok", "bystander echoes", "lost/late", "max added ms", "missed deadlines",
                           "acked lost", "exit", "told"]))
        for r in results:
            for line in r.failures:
                print(f"FAIL {r.name}: {line}")
            for line in r.notes:
                print(f"note {r.name}: {line}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
