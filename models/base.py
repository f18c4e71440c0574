"""The foreground interaction-model contract and its optional features (docs/architecture.md: the model contract).

Every 200 ms micro-turn the engine calls `step` once with every session due that tick. `step` runs on
the one inference thread, never on the event loop, and a session's output must not depend on which
other sessions share its batch.
"""

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
import numpy.typing as npt

from streaming.types import SAMPLE_RATE, TICK_SAMPLES, TICK_SECONDS, Audio

__all__ = [
    "SAMPLE_RATE",
    "TICK_SAMPLES",
    "TICK_SECONDS",
    "Ageing",
    "BackgroundChunk",
    "Delegation",
    "Event",
    "InteractionModel",
    "ModelFeatures",
    "OffThreadWork",
    "Preloading",
    "SessionState",
    "Shutdown",
    "StepBudget",
    "TickInput",
    "TickOutput",
    "silence",
]


def silence() -> Audio:
    return np.zeros(TICK_SAMPLES, dtype=np.float32)


@dataclass
class Event:
    """Something the model decided this micro-turn.

    Known types: speech_started, speech_stopped (the user's voice, by the model's VAD), yielded
    (the assistant gave up the floor), backchannel, delegate (data: {"query": str}).
    """

    type: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class BackgroundChunk:
    """A piece of a background reasoner's answer, delivered into the next micro-turn."""

    request_id: str  # which background request produced it
    epoch: int  # the session's background epoch when the request was made; stale epochs are dropped
    text: str  # text delta ("" on a pure done/error chunk)
    done: bool = False  # the request's answer is complete
    error: str | None = None  # set when the request failed; the foreground may say so
    ask: int | None = None  # the `ask` number of the foreground's delegate event it answers (None: not numbered)


@dataclass
class TickInput:
    audio: Audio  # float32[4800] at 24 kHz, silence-padded; never skipped
    received: int  # how many samples of `audio` really arrived this tick
    video: npt.NDArray[np.uint8] | None = None  # [H, W, 3] newest frame seen during the tick
    text: list[str] = field(default_factory=list)  # typed / injected user text
    background: list[BackgroundChunk] = field(default_factory=list)  # arrived since last tick
    # Beyond the basic contract: the client asked to stop the current utterance (response.cancel).
    # The model drops what it was going to say; it is a request, not a state.
    cancel: bool = False

    def __post_init__(self) -> None:
        assert self.audio.shape == (TICK_SAMPLES,), f"tick audio must be [{TICK_SAMPLES}], got {self.audio.shape}"
        assert self.audio.dtype == np.float32, f"tick audio must be float32, got {self.audio.dtype}"


@dataclass
class TickOutput:
    audio: Audio  # float32[4800] at 24 kHz; zeros when silent
    text: str = ""  # what the assistant said or thought this tick
    user_text: str = ""  # transcript of the user, when the model produces one
    events: list[Event] = field(default_factory=list)

    @property
    def silent(self) -> bool:
        return not bool(np.any(self.audio))


# Whatever a model keeps per session (KV slot, delay line, VAD state...). Opaque to the server; each
# model names its own concrete type, so the contract uses Any (a Protocol here would make every
# model's `step` signature incompatible by contravariance).
SessionState: TypeAlias = Any


@runtime_checkable
class InteractionModel(Protocol):
    name: str
    # How many sessions the model can hold at once (KV slots); None when memory is not the limit.
    max_sessions: int | None

    def open(self, session_id: str) -> SessionState:
        """Allocate a session's persistent state. Called on the inference thread."""
        ...

    def step(self, batch: Sequence[tuple[SessionState, TickInput]]) -> list[TickOutput]:
        """One micro-turn for every session in `batch`, in order. Called on the inference thread."""
        ...

    def close(self, state: SessionState) -> None:
        """Free a session's state. Called on the inference thread."""
        ...


@runtime_checkable
class StepBudget(Protocol):
    """Optional, beside `InteractionModel`: a model whose real-time step may wait (for late off-thread
    work) is told how long the coming step may take.

    One inference thread steps every batch: a step that runs past the moment the next batch is due (a
    session in another phase slot, or this batch's own next micro-turn) delays that batch, and past a
    micro-turn it is a missed deadline. The engine knows those moments; the model knows what it would
    wait for. Called on the inference thread right before each `step`.
    """

    def step_budget(self, seconds: float | None) -> None:
        """The coming step should return within `seconds` (>= 0) of now to delay no other step;
        None: the engine sets none (media pace, where nothing waits on the clock, or a session stepped
        alone after its batch's step failed); the model keeps within a micro-turn by itself."""
        ...


@runtime_checkable
class OffThreadWork(Protocol):
    """Optional, beside `InteractionModel`: a model whose step uses results of work it started on
    other threads or processes (recognisers, classifiers, synthesis) at fixed micro-turns.

    In real time the step waits for late work briefly and then falls back; in media pace nothing
    must fall back (the two paces would then say different things), so the engine steps a media
    session only once the work its next step uses is done, waiting on the event loop rather than
    holding the inference thread that real-time sessions share.
    """

    def pending_work(self, state: SessionState) -> Sequence[Future[Any]]:
        """The work (done or not) that the session's next step will use. Called on the event loop while
        no step of the session runs; must only read the state."""
        ...


def wait_work(model: OffThreadWork, states: Sequence[SessionState], timeout: float = 30.0) -> None:
    """Block until the off-thread work the next micro-turn of `states` uses is done (or failed: the step
    falls back as it would in real time, and logs it).

    What the engine's media loop waits for (`pending_work`), for drivers that step a model directly and
    faster than real time (tests, offline evaluation): without it they would see the real-time fallbacks
    of an overloaded machine.
    """
    for s in states:
        for f in model.pending_work(s):
            with contextlib.suppress(CancelledError):
                f.exception(timeout=timeout)


@runtime_checkable
class Delegation(Protocol):
    """Optional: whether the model ever emits `delegate`. A model without this attribute may; one with
    `delegates = False` (echo) never does, so the server does not preload a background reasoner for it."""

    delegates: bool


@runtime_checkable
class Shutdown(Protocol):
    """Optional: a model with threads, processes or files to release when the server stops."""

    def shutdown(self) -> None:
        """Called once, on the inference thread, after the last step."""
        ...


@runtime_checkable
class Ageing(Protocol):
    """Optional: a model whose step cost grows with a session's age, up to `steady_age` micro-turns.

    Admission measures the step cost at that age (server/admission.py), so that the capacity it
    derives holds for sessions that have talked for a long time; benchmarks measure costs by age.
    """

    @property
    def steady_age(self) -> int:
        """Micro-turns after which a session's step cost stops growing."""
        ...

    def fast_forward(self, state: SessionState, ticks: int) -> None:
        """Age a fresh session to `ticks` micro-turns without stepping them: its next step costs what a
        step at that age costs (its outputs mean nothing). Called on the inference thread."""
        ...


@runtime_checkable
class Rebuilding(Protocol):
    """Optional: a model whose per-session state another replica can rebuild from a log of the session's
    micro-turns (the native model: models/interaction/replay.py). The server keeps the log in its session
    store and, when the session moves, replays it into a fresh state opened under the same session id."""

    def keep_log(self, state: SessionState) -> None:
        """Log this session's micro-turns from now on (a fresh session, before its first step)."""
        ...

    def take_log(self, state: SessionState) -> list[bytes]:
        """The micro-turns logged since the last call, one self-contained record each (then forgotten)."""
        ...

    def rebuild(self, state: SessionState, records: list[bytes]) -> None:
        """Step `state` through `records` (the next ones of its log, in order); raises ValueError when a
        replayed output differs from the logged one. Called on the inference thread."""
        ...


@runtime_checkable
class Preloading(Protocol):
    """Optional, on a background reasoner (models/background): load its weights now, on its own thread,
    so that the first answer does not wait for them. A failure is raised again by the first request."""

    def preload(self) -> Future[None]: ...


@dataclass(frozen=True)
class ModelFeatures:
    """Which optional Protocols a model implements, resolved once (the engine holds them)."""

    delegates: bool  # `Delegation` (True when the model does not say)
    step_budget: Callable[[float | None], None] | None  # `StepBudget`
    pending_work: Callable[[SessionState], Sequence[Future[Any]]] | None  # `OffThreadWork`
    ageing: Ageing | None  # `Ageing`: the model itself
    shutdown: Callable[[], None] | None  # `Shutdown`

    @classmethod
    def of(cls, model: InteractionModel) -> "ModelFeatures":
        return cls(delegates=model.delegates if isinstance(model, Delegation) else True,
                   step_budget=model.step_budget if isinstance(model, StepBudget) else None,
                   pending_work=model.pending_work if isinstance(model, OffThreadWork) else None,
                   ageing=model if isinstance(model, Ageing) else None,
                   shutdown=model.shutdown if isinstance(model, Shutdown) else None)


class SlotState(Protocol):
    """A session that holds one row (slot) of a model's batched state."""

    session_id: str
    slot: int
    closed: bool


def check_slot_batch(states: Sequence[SlotState]) -> None:
    """Refuse a step batch that would corrupt slot-batched state: a closed session, or one twice."""
    for s in states:
        if s.closed:
            raise ValueError(f"session {s.session_id} was closed; open a new one before stepping it")
    if len({s.slot for s in states}) != len(states):
        raise ValueError("a session appears twice in one step batch; step each session once per micro-turn")
