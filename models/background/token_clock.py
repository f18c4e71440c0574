"""The embedded reasoner's work clock: the tokens it evaluated, at their measured cost.

Media pace times a background request by the reasoner's compute, not by the wall (clock.py). The CPU
time of the generation thread was that measure, and it moved with the machine's load: a media run that
shared the 2 cores with two other benchmarks started its answers 2.4-3.6 s after the delegate, against
1.6-2.0 s alone. Token counts do not depend on load at all. This clock counts what was computed and
prices it with costs measured once, on the generation thread, right after the weights load:
  - prompt tokens evaluated (llama.cpp's batched prefill; a prefix kept from the previous request is
    not evaluated again and costs nothing),
  - generated tokens (one decode step each, sampling and detokenising included).
The counts are llama.cpp's own performance counters, read on the generation thread after each token.
In 2 real-time sessions on 2 cores, a generation's CPU time matched this clock (1.00x, median of 50),
while its wall time was 1.7x: the niced thread waited for a core, which media pace does not model.

Costs are the cheaper of two measured rounds, in CPU seconds of the generation thread where llama.cpp
computes on it alone (`n_threads=1`), otherwise in wall seconds. Where llama.cpp has no counters, or
the measurement fails, there is no token clock and the reasoner keeps its CPU-time clock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# Plain prose (~60 tokens with SmolLM2's tokenizer): a prompt as long as a short conversation turn.
CALIBRATION_PROMPT = (
    "The library opens at nine in the morning and closes at six in the evening on weekdays. On "
    "Saturdays it opens at ten, and on Sundays it stays closed. Visitors may borrow up to five books "
    "at a time for three weeks. Question: when does the library open on Saturdays? Answer:"
)
CALIBRATION_TOKENS = 12  # generated per round
CALIBRATION_ROUNDS = 2  # the first also warms the weights up; the cheaper round counts
MIN_DECODES = 3  # fewer measured decode steps than this (an early end of text): no estimate


@dataclass(frozen=True)
class TokenCost:
    prompt: float  # seconds per prompt token evaluated
    decode: float  # seconds per generated token


def eval_counts(llm: Any) -> tuple[int, int] | None:
    """(prompt tokens evaluated, decode steps) so far in `llm`'s context; None where there are no counters."""
    try:
        import llama_cpp

        data = llama_cpp.llama_perf_context(llm.ctx)
        return int(data.n_p_eval), int(data.n_eval)
    except Exception:  # an older or newer binding without the counters: no token clock
        return None


def measure_cost(llm: Any, timer: Callable[[], float]) -> TokenCost | None:
    """Time a prefill and a few decode steps (see the module docstring); None if it cannot."""
    best_prompt = best_decode = math.inf
    for _ in range(CALIBRATION_ROUNDS):
        llm.reset()  # evaluate the whole prompt, not a prefix kept from before
        before = eval_counts(llm)
        if before is None:
            return None
        t0 = timer()
        t1, mid = 0.0, None  # when the first token came, and the counts then
        for _chunk in llm.create_completion(CALIBRATION_PROMPT, max_tokens=CALIBRATION_TOKENS,
                                            temperature=0.0, seed=0, stream=True):
            if mid is None:
                t1, mid = timer(), eval_counts(llm)
        end, after = timer(), eval_counts(llm)
        if mid is None or after is None:
            continue
        prompt, decodes = mid[0] - before[0], after[1] - mid[1]
        if prompt > 0:
            best_prompt = min(best_prompt, (t1 - t0) / prompt)
        if decodes >= MIN_DECODES:
            best_decode = min(best_decode, (end - t1) / decodes)
    llm.reset()
    if not (math.isfinite(best_prompt) and math.isfinite(best_decode)):
        return None
    return TokenCost(best_prompt, best_decode)


class TokenClock:
    """Seconds of modelled compute. Written on the generation thread, read anywhere (one float)."""

    def __init__(self) -> None:
        self.cost: TokenCost | None = None
        self.seconds = 0.0
        self._last: tuple[int, int] | None = None

    @property
    def ready(self) -> bool:
        return self.cost is not None

    def calibrate(self, llm: Any, timer: Callable[[], float], replaced: Callable[[], float]) -> None:
        """Measure the costs; the clock then goes on from the reading of the clock it replaces."""
        cost = measure_cost(llm, timer)
        if cost is None:
            log.warning("llama.cpp has no usable performance counters: media pace times the background "
                        "by its thread's CPU time, which moves with the machine's load")
            return
        self._last = eval_counts(llm)
        self.seconds = replaced()
        self.cost = cost  # last: readers switch to this clock only once it goes on from the old one
        log.info("background token costs: %.2f ms a prompt token, %.2f ms a generated token",
                 cost.prompt * 1e3, cost.decode * 1e3)

    def account(self, llm: Any) -> None:
        """Add the tokens evaluated since the last call (on the generation thread)."""
        if self.cost is None:
            return
        counts = eval_counts(llm)
        if counts is None or self._last is None:
            return
        prompt, decodes = counts[0] - self._last[0], counts[1] - self._last[1]
        self._last = counts
        # Counters only grow within one context; a negative step would mean they were reset: skip it.
        self.seconds += max(0, prompt) * self.cost.prompt + max(0, decodes) * self.cost.decode


class CountClock:
    """The same clock for a reasoner that reports its token counts instead of exposing its context
    (llama-server's per-request `timings`): seconds = prompt tokens evaluated x their cost + generated
    tokens x theirs, costs measured once by the caller. Event-loop only (one float, read anywhere)."""

    def __init__(self) -> None:
        self.cost: TokenCost | None = None
        self.seconds = 0.0

    @property
    def ready(self) -> bool:
        return self.cost is not None

    def set_cost(self, cost: TokenCost, replaced: Callable[[], float]) -> None:
        """Take over from the clock `replaced` at its reading now."""
        self.seconds = replaced()
        self.cost = cost
        log.info("background token costs: %.2f ms a prompt token, %.2f ms a generated token",
                 cost.prompt * 1e3, cost.decode * 1e3)

    def add(self, prompt: int, decodes: int) -> None:
        if self.cost is not None:
            self.seconds += max(0, prompt) * self.cost.prompt + max(0, decodes) * self.cost.decode
