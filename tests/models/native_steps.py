"""Stepping a native-model session through audio in process, as the media-pace engine does."""

import contextlib
from concurrent.futures import CancelledError, Future

import numpy as np

from models.base import Event, TickInput
from models.interaction import NativeModel
from models.interaction.config import ACTIONS
from models.interaction.session import NativeSession
from models.interaction.turn_check import TurnChecker, Words
from streaming.types import TICK_SAMPLES

DELEGATE = ACTIONS.index("delegate")


class LateChecker:
    """The model's real turn checker, each verdict handed over only `late` micro-turns past its due one: what
    a machine too busy for the check's budget does to it in real time (`step_through(late=...)`)."""

    def __init__(self, real: TurnChecker, late: int) -> None:
        self.real, self.late = real, late
        self.held: dict[Future[Words], Future[Words]] = {}  # handed to the model -> the real verdict

    def submit(self, audio: np.ndarray) -> Future[Words]:
        handed: Future[Words] = Future()
        self.held[handed] = self.real.submit(audio)
        return handed

    def release(self, st: NativeSession) -> Future[Words] | None:
        """Hand over the session's verdict once it is `late` micro-turns past due; the one still held, if any."""
        checking = st.floor.checking
        if checking is None or checking.future not in self.held:
            return None
        handed = checking.future
        if st.tick < checking.due + self.late:
            return handed
        if handed.set_running_or_notify_cancel():
            handed.set_result(self.held.pop(handed).result(timeout=60))
        return None


def step_through(model: NativeModel, audio: np.ndarray, name: str, ticks: int | None = None,
                 events: list[tuple[int, Event]] | None = None, typed: dict[int, str] | None = None,
                 sessions: list[NativeSession] | None = None, late: int = 0) -> str:
    """Step a fresh session through `audio` (24 kHz), or its first `ticks` micro-turns, waiting for the work
    each micro-turn uses as the media-pace engine does; per micro-turn S (speaking), D (a hand-off) or .
    (neither). `events` collects (micro-turn, event) of what the steps emitted; `typed[k]` is text typed in
    micro-turn k; `sessions` gets the session, closed, for what it kept; `late`: each turn check's verdict
    comes this many micro-turns past its due one (`LateChecker`)."""
    if ticks is not None:
        audio = audio[: ticks * TICK_SAMPLES]
    n = -(-len(audio) // TICK_SAMPLES)
    audio = np.pad(audio, (0, n * TICK_SAMPLES - len(audio))).astype(np.float32)
    real = model.floor.checker
    delayed = LateChecker(real, late) if late and real is not None else None
    if delayed is not None:
        model.floor.checker = delayed  # type: ignore[assignment]  # a TurnChecker whose verdicts come late
    st = model.open(name)
    if sessions is not None:
        sessions.append(st)
    out = ""
    try:
        for k in range(n):
            held = delayed.release(st) if delayed is not None else None
            for job in model.pending_work(st):  # as the engine's media loop (models.base.wait_work) ...
                if job is not held:  # ... but a verdict held back is late: the step finds it missing
                    with contextlib.suppress(CancelledError):
                        job.exception(timeout=60.0)
            text = [typed[k]] if typed and k in typed else []
            tick = model.step([(st, TickInput(audio[k * TICK_SAMPLES : (k + 1) * TICK_SAMPLES], TICK_SAMPLES,
                                              text=text))])[0]
            if events is not None:
                events.extend((k, e) for e in tick.events)
            out += "S" if st.speaking else "D" if st.last_action == DELEGATE else "."
    finally:
        model.close(st)
        model.floor.checker = real
    return out
