"""How many sessions the engine can step inside the micro-turn budget.

Measured at start-up by stepping batches of throw-away sessions with silence. Models whose cost
depends on content (speech recognisers) are cheaper on silence, so the estimate keeps a margin;
`--max-sessions` overrides it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from models.base import TickInput, silence
from streaming.types import TICK_SAMPLES

if TYPE_CHECKING:
    from server.engine import Engine

log = logging.getLogger(__name__)

BUDGET_FRACTION = 0.6  # of a micro-turn, leaving room for jitter and transports
HARD_CAP = 256  # sessions; beyond this the event loop, not the model, is the limit


def _measure(engine: Engine, batch: int, reps: int = 3) -> float:
    """Seconds per batched step (median of `reps`) with `batch` fresh sessions; runs on the inference thread."""
    model = engine.model
    states = [model.open(f"calibrate-{i}") for i in range(batch)]
    try:
        times = []
        for _ in range(reps + 1):  # the first step warms caches and is not counted
            inputs = [(st, TickInput(silence(), TICK_SAMPLES)) for st in states]
            t = time.perf_counter()
            model.step(inputs)
            times.append(time.perf_counter() - t)
        return float(np.median(times[1:]))
    finally:
        for st in states:
            model.close(st)


async def estimate_capacity(engine: Engine) -> int:
    budget = engine.period * BUDGET_FRACTION
    limit = engine.model.max_sessions or HARD_CAP
    batch, best = 1, 1
    while batch <= min(limit, HARD_CAP):
        cost = await engine.call(_measure, engine, batch)
        per_session = cost / batch
        fits = int(budget / max(per_session, 1e-6))
        log.info("calibration: batch %d stepped in %.2f ms -> about %d sessions fit", batch, cost * 1000, fits)
        best = min(fits, limit, HARD_CAP)
        if cost > budget / 2 or batch >= best:
            break
        batch *= 4
    return max(1, best)
