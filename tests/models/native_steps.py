"""Stepping a native-model session through audio in process, as the media-pace engine does."""

import numpy as np

from models.base import Event, TickInput, wait_work
from models.interaction import NativeModel
from models.interaction.config import ACTIONS
from models.interaction.serving import NativeSession
from streaming.types import TICK_SAMPLES

DELEGATE = ACTIONS.index("delegate")


def step_through(model: NativeModel, audio: np.ndarray, name: str, ticks: int | None = None,
                 events: list[tuple[int, Event]] | None = None, typed: dict[int, str] | None = None,
                 sessions: list[NativeSession] | None = None) -> str:
    """Step a fresh session through `audio` (24 kHz), or its first `ticks` micro-turns, waiting for the work
    each micro-turn uses as the media-pace engine does; per micro-turn S (speaking), D (a hand-off) or .
    (neither). `events` collects (micro-turn, event) of what the steps emitted; `typed[k]` is text typed in
    micro-turn k; `sessions` gets the session, closed, for what it kept."""
    if ticks is not None:
        audio = audio[: ticks * TICK_SAMPLES]
    n = -(-len(audio) // TICK_SAMPLES)
    audio = np.pad(audio, (0, n * TICK_SAMPLES - len(audio))).astype(np.float32)
    st = model.open(name)
    if sessions is not None:
        sessions.append(st)
    out = ""
    try:
        for k in range(n):
            wait_work(model, [st], 60.0)
            text = [typed[k]] if typed and k in typed else []
            tick = model.step([(st, TickInput(audio[k * TICK_SAMPLES : (k + 1) * TICK_SAMPLES], TICK_SAMPLES,
                                              text=text))])[0]
            if events is not None:
                events.extend((k, e) for e in tick.events)
            out += "S" if st.speaking else "D" if st.last_action == DELEGATE else "."
    finally:
        model.close(st)
    return out
