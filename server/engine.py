"""The micro-turn engine: one clock, one inference thread, batched steps.

What it does every micro-turn, for every live session:
  1. take the session's pending input (silence-padded, surplus kept, oldest dropped past a bound),
  2. run one batched `model.step` for all sessions due at the same moment, on the inference thread,
  3. hand each output to its session's transport, on the event loop.

Real-time sessions tick at absolute deadlines on a grid of phase slots (server/schedule.py). The slot
of each session is chosen from when its input actually arrives, so a client whose 200 ms chunks land
just after a shared tick does not wait almost a whole micro-turn: each session ticks in the first slot
after its chunks are complete. Sessions in the same slot are stepped in one batch. The steps run on
the inference thread (server/inference.py).

Media-pace sessions are stepped as soon as a full micro-turn of input has arrived, as fast as the
model allows; the model sees exactly the same inputs as in real time, so the outputs are identical.

What the engine does not know: sockets, JSON, the wire protocol. The runtime (server/runtime.py)
pushes the transports' input into a `Session`; outputs leave through its `OutputSink`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from models.base import InteractionModel, ModelFeatures, SessionState, TickInput
from server.inference import Batch, InferenceThread, StepResult
from server.media_gate import MediaGate
from server.metrics import Metrics
from server.schedule import PhaseGrid
from server.sessions import Pace, Session
from streaming.types import TICK_SAMPLES, TICK_SECONDS

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_IN_FLIGHT = 2  # steps queued per session before its next deadline waits (bounded memory when overloaded)
# How much later than its deadline a real-time step may start because an earlier batch's step waited
# for late off-thread work (`StepBudget`): a pause's end-of-turn job a little past its micro-turn is
# then used in it, not a micro-turn later, at the price of up to this much jitter in other sessions'
# output (nothing they say changes).
STEP_DELAY_S = 0.1
CATCH_UP_STREAK = 3  # ticks a surplus must persist before an extra tick is stepped to drain it


def _loop_ended(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("engine task %s died; /healthz now answers 503", task.get_name(), exc_info=task.exception())


@dataclass
class _Planned:
    session: Session
    tick: int  # the session's micro-turn index
    deadline: float | None  # absolute deadline (real-time pace), None in media pace
    ready_at: float | None = None  # when this tick's input completed (real-time pace, whole micro-turn only)
    heard: int = 0  # the session's input samples taken through this tick, underruns' padding excluded


class Engine:
    def __init__(self, model: InteractionModel, metrics: Metrics, phase_groups: int = 20, guard: float = 0.001,
                 late_input: float = 0.02, period: float = TICK_SECONDS,
                 clock: Callable[[], float] = time.monotonic, hang_after: float = 2.0) -> None:
        if phase_groups < 1:
            raise ValueError("phase_groups must be >= 1")
        self.model = model
        self.features = ModelFeatures.of(model)  # its optional Protocols (models/base.py), resolved once
        self.metrics = metrics
        self.period = period
        self.phases = PhaseGrid(period, phase_groups, clock)
        self.guard = guard  # margin after a chunk's arrival before its tick, for jitter (s)
        self.late_input = late_input  # how long a tick waits for a late chunk before stepping silence (s)
        self.clock = clock
        self.inference = InferenceThread(model, self.features, metrics, clock, hang_after)
        self._realtime: set[Session] = set()
        self._media: set[Session] = set()
        self._rt_wake = asyncio.Event()
        self._media_wake = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._miss_logged_at = -float("inf")  # when the last missed deadline was logged (rate limit)
        self._gate = MediaGate(self.features.pending_work, self._media_wake.set)  # media pace's other waits

    @property
    def groups(self) -> int:
        return self.phases.groups

    @property
    def grid(self) -> float:
        """Spacing of phase slots (s)."""
        return self.phases.grid

    def set_phase_groups(self, groups: int) -> None:
        """Choose the phase grid (server/admission.py decides it at start-up, before any session)."""
        if self._realtime:
            raise RuntimeError("phase groups can only change while no real-time session is live")
        self.phases.set_groups(groups)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.phases.start()
        self._loops = [asyncio.create_task(self._realtime_loop(), name="duplex-realtime"),
                       asyncio.create_task(self._media_loop(), name="duplex-media"),
                       asyncio.create_task(self._watchdog(), name="duplex-step-watchdog")]
        for task in self._loops:
            task.add_done_callback(_loop_ended)

    def health(self) -> str | None:
        """None while the engine works; otherwise what is wrong (/healthz answers 503 with it)."""
        for task in self._loops:
            if task.done():
                exc = None if task.cancelled() else task.exception()
                return f"engine loop {task.get_name()} stopped" + (f": {type(exc).__name__}: {exc}" if exc else "")
        return self.inference.hang()

    async def _watchdog(self) -> None:
        """Report a step that runs far past a micro-turn: it stalls every session of its batch."""
        while True:
            await asyncio.sleep(self.inference.hang_after / 4)
            self.inference.report_hangs()

    async def stop(self, last: Callable[[], object] | None = None) -> None:
        """Cancel the loops, let in-flight steps finish, run `last` (model shutdown) on the inference
        thread, then release the thread."""
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if last is not None:
            try:
                await self.call(last)
            except Exception:
                log.exception("model shutdown failed")
        self.inference.shutdown()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on the inference thread (model open/close, calibration)."""
        return await self.inference.call(fn, *args)

    async def open_state(self, session_id: str) -> SessionState:
        return await self.call(self.model.open, session_id)

    async def close_state(self, session: Session) -> None:
        self.remove(session)
        await self.call(self.model.close, session.state)

    # -- sessions ------------------------------------------------------------------------------

    def add(self, session: Session) -> None:
        self.remove(session)
        if session.settings.pace is Pace.REALTIME:
            # A real-time session starts ticking at its first input (see _start_ticking), not at
            # connect: before that the model has nothing to answer, and a client that switches to
            # media pace first must find its timeline still at micro-turn 0.
            self._realtime.add(session)
        else:
            self._media.add(session)
            self._media_wake.set()

    def remove(self, session: Session) -> None:
        self._realtime.discard(session)
        self._media.discard(session)

    def resumed(self, session: Session) -> None:
        """A detached session is attached again: pick up where it paused, from now."""
        if session.settings.pace is Pace.REALTIME:
            self._schedule_at(session, self.clock() + self.guard)
            self._rt_wake.set()
        else:
            self._media_wake.set()

    def push_audio(self, session: Session, audio: np.ndarray) -> int:
        """Queue real-time input; returns samples dropped because the client ran ahead."""
        dropped, completed = session.inbox.push(audio)
        if dropped:
            self.metrics.dropped_samples.inc(dropped)
        if session.settings.pace is Pace.REALTIME:
            self._start_ticking(session)
        if session.settings.pace is Pace.REALTIME and completed:
            session.sched.ready_at = self.clock()
            self._rephase(session, session.sched.ready_at)
            self._rt_wake.set()  # the loop may be waiting out the late-input allowance for this chunk
        elif session.settings.pace is Pace.MEDIA:
            self._media_wake.set()
        return dropped

    async def push_audio_media(self, session: Session, audio: np.ndarray) -> None:
        """Queue media-pace input, waiting while the backlog is full (back-pressure, nothing dropped)."""
        for start in range(0, len(audio), TICK_SAMPLES):
            piece = audio[start : start + TICK_SAMPLES]
            while not session.inbox.fits(len(piece)) and not session.closed:
                self._media_wake.set()
                await session.inbox.wait_room()
            self.push_audio(session, piece)

    def nudge(self, session: Session) -> None:
        """Something other than audio changed (text, cancel); media sessions may be steppable."""
        if session.settings.pace is Pace.MEDIA:
            self._media_wake.set()
        else:
            self._start_ticking(session)

    def _start_ticking(self, s: Session) -> None:
        """First input of a real-time session: tick in the first slot from now on; arrivals re-phase it."""
        if not s.sched.ticking:
            s.sched.ticking = True
            self._schedule_at(s, self.clock() + self.guard)
            self._rt_wake.set()

    # -- real-time scheduling --------------------------------------------------------------------

    def _deadline(self, s: Session) -> float:
        return self.phases.deadline(s.sched)

    def _schedule_at(self, s: Session, t: float) -> None:
        """Put `s` on the first slot boundary at or after `t`."""
        self.phases.place(s.sched, t)

    def _rephase(self, s: Session, now: float) -> None:
        """A full micro-turn of input just completed: tick in the first slot after it (plus the guard)."""
        if self.phases.rephase(s.sched, now, self.guard):
            self._rt_wake.set()

    def _due_at(self, s: Session) -> float:
        """When `s` must be stepped: its deadline, or up to `late_input` later while its input is late.

        A streaming client's chunk that misses its tick by a few milliseconds (network or scheduling
        jitter) would otherwise be stepped as silence and shift everything after it by a micro-turn;
        waiting a little for it, like a jitter buffer, is the better trade. A session that sends nothing
        (a silent or text-only client) still ticks, `late_input` after its deadline.
        """
        deadline = self._deadline(s)
        if s.inbox.starved():
            return deadline + self.late_input
        return deadline

    async def _realtime_loop(self) -> None:
        tolerance = 0.0005  # sessions due within this are stepped now, in the same batch
        while True:
            now = self.clock()
            # One pass: when each steppable session is due (sessions with MAX_IN_FLIGHT steps queued
            # wait for a completion, which wakes this loop).
            due_at = {s: (now if s.sched.catch_up else self._due_at(s)) for s in self._realtime
                      if s.attached and not s.closed and s.sched.ticking and s.sched.in_flight < MAX_IN_FLIGHT}
            due = [s for s, t in due_at.items() if t <= now + tolerance]
            if due:
                self._launch(due, realtime=True)
                continue
            timeout = max(0.0, min(due_at.values()) - now) if due_at else 1.0
            self._rt_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rt_wake.wait(), timeout)

    async def _media_loop(self) -> None:
        while True:
            await self._media_wake.wait()
            self._media_wake.clear()
            # Typed text (or a cancel) steps a media session too, with whatever audio it has (padded):
            # a session that only types must still be answered, and its text must not pile up. A media
            # session also waits for its background reasoner to reach the session's virtual time.
            ready = [s for s in self._media if s.attached and not s.closed and s.sched.in_flight == 0
                     and s.inbox.steppable()
                     and self._gate.ready(s)]
            if ready:
                await self._launch(ready, realtime=False)
                self._media_wake.set()  # more may have become ready while stepping

    # -- stepping -----------------------------------------------------------------------------

    def _launch(self, sessions: Sequence[Session], realtime: bool) -> asyncio.Task[None]:
        """Take one micro-turn of input from each session and step them as one batch."""
        planned: list[_Planned] = []
        inputs: Batch = []
        for s in sessions:
            deadline = ready_at = None
            if realtime:
                # Lateness is the server's: when input came after the deadline, count from its arrival;
                # when it never came, from the end of the wait for it.
                if s.sched.catch_up:
                    deadline = self.clock()
                elif s.inbox.ready() == 0:
                    deadline = self._due_at(s)
                else:
                    deadline = max(self._deadline(s), s.sched.ready_at)
                    ready_at = s.sched.ready_at if s.inbox.ready() == 1 else None  # older surplus: not timed
                if not s.sched.catch_up:
                    self.phases.advance(s.sched)  # absolute cadence: the next deadline is one period on
                s.sched.catch_up = False
            tick_input = self._take_input(s, realtime)
            inputs.append((s.state, tick_input))
            planned.append(_Planned(s, s.tick, deadline, ready_at, s.inbox.heard))
            s.tick += 1
            s.sched.in_flight += 1
        # Queued on the inference thread now, not when the task first runs: a close of one of these
        # sessions (engine.close_state, also on that thread) may be queued before the task runs, and
        # would then free the state this step still uses (seen in a cascade soak: a session that left
        # right after its input was taken was stepped with its recogniser already returned).
        until = self._free_until(sessions) if realtime else None
        first = self.inference.submit(inputs, until)
        task = asyncio.create_task(self._step_and_deliver(planned, inputs, realtime, first))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _free_until(self, batch: Sequence[Session]) -> float:
        """How long this batch may hold the inference thread (engine clock), for a model that would wait
        (`StepBudget`): until the earliest next deadline of its sessions (ending past it is a missed
        deadline), and until `STEP_DELAY_S` after the deadline of any other real-time session (whose
        step would start that much later: its output leaves later within its micro-turn, the same
        output; each batch's own bound keeps such delays from adding up)."""
        inside = set(batch)
        nexts = [self._deadline(s) for s in batch]  # their marks have moved on: the next deadlines
        nexts += [self._deadline(o) + STEP_DELAY_S for o in self._realtime
                  if o not in inside and o.attached and not o.closed and o.sched.ticking]
        return min(nexts)

    def _take_input(self, s: Session, realtime: bool) -> TickInput:
        tick = s.inbox.take(s.background.drain())
        if realtime:
            if tick.received < TICK_SAMPLES:
                self.metrics.underruns.inc()
            # A surplus that persists means the client got ahead (burst or late phase): drain it.
            s.sched.surplus_streak = s.sched.surplus_streak + 1 if s.inbox.ready() >= 1 else 0
            if s.sched.surplus_streak >= CATCH_UP_STREAK:
                s.sched.catch_up, s.sched.surplus_streak = True, 0
        return tick

    async def _step_and_deliver(self, planned: list[_Planned], inputs: Batch, realtime: bool,
                                first: asyncio.Future[StepResult]) -> None:
        m = self.metrics
        outs, t_start, t_end = await self.inference.run(inputs, [p.session for p in planned], first)
        m.step_seconds.observe(t_end - t_start)
        m.batch_size.observe(len(inputs))
        m.ticks.labels("realtime" if realtime else "media").inc(len(inputs))
        # Book-keeping for the whole batch first: nothing a transport does below may leave a session
        # of this batch counted as in flight (it would never be stepped again).
        for p in planned:
            p.session.sched.in_flight -= 1
        missed: list[_Planned] = []
        for p, out in zip(planned, outs, strict=True):
            s = p.session
            if p.deadline is not None:
                s.last_lateness = max(0.0, t_start - p.deadline)
                m.lateness_seconds.observe(s.last_lateness)
                if t_end > p.deadline + self.period:
                    m.missed_deadlines.inc()
                    missed.append(p)
            s.heard_through = p.heard
            if s.closed:
                continue
            try:
                t = p.tick * self.period
                s.log.add(t, "user", out.user_text)
                s.log.add(t, "assistant", out.text)
                for ev in out.events:  # what the camera showed when a question went to the reasoner
                    if ev.type == "vision" and isinstance(ev.data.get("facts"), str):
                        s.log.add(t, "user", ev.data["facts"], kind="vision")
                s.background.on_output(out, p.tick)
                s.deliver(out, p.tick)
            except Exception:  # one session's transport or worker must not stop the others' delivery
                log.exception("session %s: delivering micro-turn %d failed", s.id, p.tick)
                m.delivery_errors.inc()
            if p.ready_at is not None:
                m.turnaround_seconds.observe(self.clock() - p.ready_at)
        if missed:
            self._log_missed(missed, len(planned), t_start, t_end)
        if realtime:
            self._rt_wake.set()
        else:
            self._media_wake.set()

    def _log_missed(self, missed: list[_Planned], batch: int, t_start: float, t_end: float) -> None:
        """Say why micro-turns missed: a late start (the inference thread or the event loop was busy
        before the step) or a long step (the model itself). At most one line a second."""
        now = self.clock()
        if now - self._miss_logged_at < 1.0:
            return
        self._miss_logged_at = now
        worst = min(missed, key=lambda p: p.deadline if p.deadline is not None else now)
        assert worst.deadline is not None
        log.warning("%d of %d micro-turns in a batch missed their deadline (worst: session %s tick %d, done "
                    "%.0f ms after its deadline): the step started %.0f ms after the deadline and ran %.0f ms",
                    len(missed), batch, worst.session.id, worst.tick, (t_end - worst.deadline) * 1e3,
                    (t_start - worst.deadline) * 1e3, (t_end - t_start) * 1e3)
