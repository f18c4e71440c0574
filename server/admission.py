"""What the engine can afford: how many sessions fit the micro-turn budget, and how many phase groups.

Measured at start-up by stepping batches of throw-away sessions with silence (aged to the model's
`steady_age` when it implements `Ageing`, models/base.py, so the fit holds for old sessions) and fitting
`step(b) = overhead + b * per_session`. Two decisions follow from that fit:

- **phase groups**: every group is one more batched step per micro-turn, so it costs one more
  `overhead`. Models whose step is mostly per-session work (echo, the cascade) can afford many groups,
  and each session then waits at most a couple of milliseconds for its tick; a model whose step is
  mostly fixed cost (the native transformer on a CPU) should batch everyone into one or a few groups.
  We spend at most a quarter of the budget on per-batch overhead.
- **capacity**: sessions that fit `groups * overhead + n * per_session <= budget`, then lowered to the
  model's own cap and, for a model that delegates, to what the background reasoner answers well at once
  (`admitted`).

Models whose cost depends on content (speech recognisers) are cheaper on silence, so the budget keeps
a margin; `--max-sessions` and `--phase-groups` override either decision.

Measured when the process is quiet: a model's own start-up work (pre-rendering phrases, warming its
workers) runs on threads of its own after it loads, and a step timed beside it costs more than it does
alone (admission under-counted), so admission waits until the process's other threads are seldom
running (in under `QUIET_SHARE` of a window's samples, at most `QUIET_WAIT_S`). Their states, not their
CPU time: on a machine busy with other processes a thread at work gets a fraction of a core and would
pass for quiet. Each figure is the fastest of its repeats: interference only ever adds to a step, so the fastest is the
nearest to what the step itself costs, and a server never admits fewer sessions than that allows.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from models.background import Concurrency, Reasoner
from models.base import TickInput, silence
from streaming.types import TICK_SAMPLES

if TYPE_CHECKING:
    from server.engine import Engine

log = logging.getLogger(__name__)

BUDGET_FRACTION = 0.6  # of a micro-turn, leaving room for jitter, transports and the background model
OVERHEAD_SHARE = 0.25  # of the budget that per-batch overhead (one per phase group) may take
MAX_GROUPS = 100  # a 2 ms grid; finer buys nothing against event-loop timer resolution
HARD_CAP = 256  # sessions; beyond this the event loop, not the model, is the limit
QUIET_SHARE = 0.2  # of a window's samples with another thread of the process running: start-up work is done
QUIET_WINDOW_S = 0.5  # over this long, sampled every 20 ms
QUIET_WAIT_S = 30.0  # the longest start-up waits for it (a model that keeps busy is measured as it is)


@dataclass
class Calibration:
    overhead: float  # seconds a batched step costs whatever its size
    per_session: float  # seconds each session adds to a step

    def groups(self, budget: float) -> int:
        return max(1, min(MAX_GROUPS, math.floor(OVERHEAD_SHARE * budget / max(self.overhead, 1e-6))))

    def capacity(self, budget: float, groups: int, limit: int) -> int:
        room = budget - groups * self.overhead
        return max(1, min(limit, HARD_CAP, math.floor(room / max(self.per_session, 1e-6))))


async def quiet(share: float = QUIET_SHARE, window: float = QUIET_WINDOW_S, limit: float = QUIET_WAIT_S
                ) -> tuple[float, float]:
    """Wait until another thread of this process is running in under `share` of a `window`'s samples
    (their start-up work is done), at most `limit` seconds; returns (seconds waited, the last window's
    share). Where /proc cannot be read, it does not wait."""
    t0, me = time.monotonic(), threading.get_native_id()
    while True:
        samples: list[bool] = []
        for _ in range(max(1, round(window / 0.02))):
            if samples and time.monotonic() - t0 >= limit:
                break  # a starved sampler (many threads, a loaded host) still keeps to the limit
            running = _running_threads(me)
            if running is None:
                return time.monotonic() - t0, 0.0
            samples.append(running > 0)
            await asyncio.sleep(0.02)
        busy = sum(samples) / len(samples)
        if busy < share or time.monotonic() - t0 >= limit:
            return time.monotonic() - t0, busy


def _running_threads(me: int) -> int | None:
    """Threads of this process other than `me` that are running or ready to (state R); None without /proc."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    running = 0
    for tid in tids:
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        running += stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"R"
    return running


def _measure(engine: Engine, batch: int, reps: int = 5) -> float:
    """Seconds per batched step (the fastest of `reps`) with `batch` fresh sessions; runs on the
    inference thread."""
    model, ageing = engine.model, engine.features.ageing
    states = [model.open(f"calibrate-{i}") for i in range(batch)]
    try:
        # A step whose cost grows with session age (the native model attends to what was written, up
        # to its cap) is measured at the age where it stops growing: capacity must hold for old sessions.
        if ageing is not None and ageing.steady_age:
            for st in states:
                ageing.fast_forward(st, ageing.steady_age)
        times = []
        for _ in range(reps + 1):  # the first step warms caches and is not counted
            inputs = [(st, TickInput(silence(), TICK_SAMPLES)) for st in states]
            t = time.perf_counter()
            model.step(inputs)
            times.append(time.perf_counter() - t)
        return float(np.min(times[1:]))
    finally:
        for st in states:
            model.close(st)


async def calibrate(engine: Engine) -> Calibration:
    """Fit overhead + per-session cost from a batch of 1 and a larger batch."""
    limit = engine.model.max_sessions or HARD_CAP
    waited, used = await quiet()
    log.info("calibration: waited %.1f s for the process's start-up work (other threads running in %.0f%% of "
             "the last %.1f s)", waited, used * 100, QUIET_WINDOW_S)
    one = await engine.call(_measure, engine, 1)
    # A bigger batch separates the two terms better, but don't spend seconds on a slow model.
    big = min(limit, 16 if one < 0.005 else 4)
    if big <= 1:
        return Calibration(overhead=one, per_session=one)
    many = await engine.call(_measure, engine, big)
    per_session = max((many - one) / (big - 1), many / big / 10, 1e-7)
    overhead = max(one - per_session, 0.0)
    log.info("calibration: step(1) %.3f ms, step(%d) %.3f ms -> overhead %.3f ms + %.3f ms per session",
             one * 1000, big, many * 1000, overhead * 1000, per_session * 1000)
    return Calibration(overhead, per_session)


def budget(engine: Engine) -> float:
    return engine.period * BUDGET_FRACTION


def admitted(measured: int, explicit: int | None, model_cap: int | None, model_name: str,
             reasoner: Reasoner | None, delegates: bool) -> tuple[int, str]:
    """Sessions to admit and why (start-up says it). `measured` is the calibration's figure, or the
    operator's `--max-sessions` when `explicit` is set; the model's cap lowers either. The reasoner's
    `Concurrency` lowers it only when the operator did not choose: deadlines would hold more sessions,
    but their answers would queue on the reasoner and start after the user has moved on."""
    capacity, why = measured, "set by --max-sessions" if explicit is not None else "measured at start-up"
    if model_cap is not None and model_cap <= capacity:  # at a tie, the cap is what decided
        capacity, why = model_cap, f"the model's own cap: {model_name}, max_sessions={model_cap}"
    if (explicit is None and delegates and isinstance(reasoner, Concurrency)
            and reasoner.conversations_at_once < capacity):
        capacity, why = reasoner.conversations_at_once, (
            f"what the background reasoner {reasoner.name} answers well at once; --background llama-server "
            "answers sessions together, or set --max-sessions")
    return capacity, why
