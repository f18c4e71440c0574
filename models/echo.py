"""Diagnostic model: returns its input delayed by N micro-turns.

It exists to measure the transport (latency, pacing, resume). It is never the default model.
"""

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from models.base import TickInput, TickOutput, silence
from streaming.types import Audio


@dataclass
class EchoState:
    session_id: str
    # The last `delay` inputs, oldest first; starts as silence so output n is input n - delay.
    line: deque[Audio] = field(default_factory=deque)
    ticks: int = 0  # micro-turns stepped so far


class EchoModel:
    name = "echo"
    max_sessions: int | None = None
    delegates = False  # it never asks the background reasoner anything (server/runtime.py: no preload)

    def __init__(self, delay: int = 1) -> None:
        if delay < 0:
            raise ValueError(f"echo delay must be >= 0 micro-turns, got {delay}")
        self.delay = delay

    def open(self, session_id: str) -> EchoState:
        return EchoState(session_id, deque(silence() for _ in range(self.delay)))

    def step(self, batch: Sequence[tuple[EchoState, TickInput]]) -> list[TickOutput]:
        out = []
        for state, tick in batch:
            state.line.append(tick.audio.copy())
            audio = state.line.popleft()
            state.ticks += 1
            text = " ".join(tick.text)
            out.append(TickOutput(audio=np.asarray(audio, dtype=np.float32), text=text))
        return out

    def close(self, state: EchoState) -> None:
        state.line.clear()
