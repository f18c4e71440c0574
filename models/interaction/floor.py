"""The native model's floor: what the words and the overlap cues say of the model's decision, per session.

The model proposes an action each micro-turn from its heads; the floor disposes, in one call between the
heads and the gate (`Floor.decide`): the turn check's verdict on the user's words (turn_check.py) holds an
onset back while it is late and decides with the keenest one proposed meanwhile (onset.py), the longest wait
takes the turn, and the overlap check (overlap_check.py) holds a stop under a backchannel or a bystander's
talk. After the gate `Floor.settle` asks the next turn check when the user stops, hands off with the user's
words (query.py) and learns the user's level from the turns the model answered. Each session keeps its
floor's state in a `FloorState`; without the checks (`--native-*-check off`) the model decides alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from torch import Tensor

from models.base import Event, TickInput
from models.interaction import onset
from models.interaction.config import ACTIONS
from models.interaction.overlap_check import (
    HOLD,
    LEAD_TICKS,
    LONGEST_TICKS,
    PROBE_TICKS,
    STOP,
    Overlap,
    OverlapChecker,
    ruling,
)
from models.interaction.query import DUE_TICKS, QUERY_CHARS, PendingQuery, QueryTranscriber, UserAudio
from models.interaction.turn_check import DUE_TICKS as CHECK_DUE_TICKS
from models.interaction.turn_check import (
    FINISHED,
    HOLD_TICKS,
    PendingCheck,
    TurnChecker,
    Words,
    after_the_wait,
    asks_to_look_up,
    whose,
)
from models.interaction.turn_check import LATE_TICKS as CHECK_LATE_TICKS
from models.interaction.turn_check import WAIT_S as CHECK_WAIT_S
from models.turns.level import UserLevel
from models.turns.work import LATE

log = logging.getLogger(__name__)
SPEAK, SILENT, BACKCHANNEL, YIELD, DELEGATE = range(len(ACTIONS))
WAITING = Words(onset.PENDING)  # the verdict due is late: no onset until it is in (turn_check.LATE_TICKS)


@dataclass
class FloorState:
    """One session's floor."""

    user_audio: UserAudio | None = None  # its recent microphone audio, where hand-offs are transcribed (query.py)
    handing_off: PendingQuery | None = None  # a hand-off decided, its query being transcribed
    checking: PendingCheck | None = None  # the words of the user's turn being judged (turn_check.py)
    verdict: Words | None = None  # what they said, until the user speaks again or the model takes the turn
    verdict_until: int = 0  # the micro-turn a verdict stops counting (turn_check.HOLD_TICKS)
    proposal: Tensor | None = None  # its keenest action probabilities while a late verdict is awaited
    user_level: UserLevel = field(default_factory=UserLevel)  # of the user's turns it answered (after_the_wait)
    overlap: Overlap | None = None  # the user's speech over the model's, and what it says (overlap_check.py)


class Seat(Protocol):
    """What the floor reads of a session (serving.NativeSession) besides its `FloorState`."""

    session_id: str
    tick: int
    speaking: bool
    user_speaking: bool
    last_action: int
    floor: FloorState


class Floor:
    """The checks a model's sessions share: `query` (Whisper for a hand-off's words; None: the recogniser's),
    `checker` (the words' verdict when the user stops; None: the model decides alone) and `overlaps` (the cues
    that hold a stop under a backchannel; None: the model decides alone). `flow_voice`: the flow head speaks
    (any action but speak gates it to silence); else the talker does (a phrase under way plays out)."""

    def __init__(self, query: QueryTranscriber | None, checker: TurnChecker | None, overlaps: OverlapChecker | None,
                 flow_voice: bool) -> None:
        self.query, self.checker, self.overlaps, self.flow_voice = query, checker, overlaps, flow_voice

    def open(self) -> FloorState:
        return FloorState(user_audio=UserAudio() if self.query or self.checker or self.overlaps else None)

    def close(self, fs: FloorState) -> None:
        if fs.handing_off is not None:
            fs.handing_off.cancel()
        if fs.checking is not None:
            fs.checking.cancel()
        if fs.overlap is not None:
            fs.overlap.cancel()

    def pending_work(self, fs: FloorState) -> list[Future[Any]]:
        """A hand-off's transcription, the turn check due and the overlap's words (`OffThreadWork`, models/base.py)."""
        work: list[Future[Any]] = []
        if fs.handing_off is not None:
            work.append(fs.handing_off.future)
        if fs.checking is not None:
            work.append(fs.checking.future)
        if fs.overlap is not None and fs.overlap.job is not None:
            work.append(fs.overlap.job.future)
        return work

    def shutdown(self) -> None:
        for part in (self.query, self.checker, self.overlaps):
            if part is not None:
                part.shutdown()

    def typed(self, st: Seat, text: str, read_in: int) -> None:
        """A typed message is a finished turn whose words are known as it arrives (the model reads it a few
        bytes a micro-turn, and often answers before its end): they settle a hand-off as a spoken turn's do
        (turn_check.py), held until `HOLD_TICKS` after its last byte is read (`read_in` micro-turns from now)."""
        if self.checker is not None and text:
            st.floor.verdict = Words(FINISHED, asks_to_look_up(text), text)
            st.floor.verdict_until = st.tick + read_in + HOLD_TICKS

    # -- between the heads and the gate ------------------------------------------------------------

    def decide(self, batch: Sequence[tuple[Seat, TickInput]], probs: Tensor, voice: list[bool],
               onset_threshold: float, delegate_threshold: float) -> list[int]:
        """Each session's action this micro-turn: the model's proposals (`probs`, its action probabilities;
        `voice`, its voice head's flag) as the words' verdicts and the overlap cues dispose of them."""
        states = [st for st, _ in batch]
        deadline = time.monotonic() + CHECK_WAIT_S  # one wait for all the checks due this step
        verdicts: list[Words | None] | None = None
        if self.checker is not None:
            verdicts = [self._verdict(st, deadline) for st in states]
            probs = self._proposals(states, probs, verdicts)
        actions: list[int] = onset.decide(probs, [st.speaking for st in states], onset_threshold, delegate_threshold,
                                          verdicts).tolist()
        for i, (st, tick) in enumerate(batch):
            fs = st.floor
            if fs.user_audio is not None:
                fs.user_audio.add(st.tick, tick.audio)
                if self.overlaps is not None and voice[i] and not st.speaking:
                    fs.user_audio.level.add(tick.audio, skip_silent=True)  # their own voice, to tell a bystander's
            if self.overlaps is not None and not tick.cancel:
                actions[i] = self._overlap(st, voice[i], deadline, actions[i])
        return actions

    @staticmethod
    def _verdict(st: Seat, deadline: float) -> Words | None:
        """The verdict on the user's turn this micro-turn decides with: one that comes due now (waited for
        until `deadline` at most; a later one holds the onset back, up to `CHECK_LATE_TICKS`), or the one held
        since (turn_check.py)."""
        fs = st.floor
        if fs.checking is not None and fs.checking.is_due(st.tick):
            late = fs.checking.late_by(st.tick)
            if late < CHECK_LATE_TICKS and not fs.checking.arrived(deadline - time.monotonic()):
                if late == 0:
                    LATE.note(fs.checking.name)
                return WAITING  # not held: the verdict, once in, is the one this turn is decided with
            verdict = whose(fs.checking.verdict(deadline - time.monotonic()), fs.user_level)
            fs.verdict, fs.verdict_until, fs.checking = verdict, st.tick + HOLD_TICKS, None
        if fs.verdict is not None and st.tick >= fs.verdict_until:
            # The user silent since (a spoken verdict ends when they speak again, either when the turn is
            # taken): the longest wait is over, the floor taken for one micro-turn where `after_the_wait` says.
            held = fs.verdict
            fs.verdict = after_the_wait(held, fs.user_level)
            if fs.verdict is not None:
                log.debug("session %s: the turn taken after the longest wait (%s: %r)", st.session_id, held.turn,
                          held.text[-80:])
        return fs.verdict

    @staticmethod
    def _proposals(states: list[Seat], probs: Tensor, verdicts: list[Words | None]) -> Tensor:
        """A late verdict disposes of what the model proposed while it was awaited: its keenest probabilities
        then (onset.keener) are kept, and the micro-turn the verdict comes in decides with them where they
        are keener than its own. Without that a verdict two micro-turns late found the shipped model's urge
        to answer gone (it rises for two or three micro-turns after the user stops) and the question waited
        3 s, for the longest wait."""
        for i, (st, v) in enumerate(zip(states, verdicts, strict=True)):
            fs = st.floor
            if v is WAITING:
                fs.proposal = probs[i] if fs.proposal is None else onset.keener(fs.proposal, probs[i])
            elif fs.proposal is not None:
                probs[i] = onset.keener(fs.proposal, probs[i])
                fs.proposal = None
        return probs

    def _overlap(self, st: Seat, voice: bool, deadline: float, action: int) -> int:
        """Open, follow and close `st`'s overlap with this micro-turn's voice flag, and the action once its cues
        ruled on the model's (overlap_check.py). Only while it speaks: once it stopped, the floor is the user's."""
        fs = st.floor
        assert self.overlaps is not None and fs.user_audio is not None
        ov = fs.overlap
        if ov is None:
            if not (voice and not st.user_speaking and st.speaking):
                return action
            ov = fs.overlap = self.overlaps.open(st.tick, fs.user_audio.since(st.tick - PROBE_TICKS + 1),
                                                 fs.user_audio.level.db)
        elif not st.speaking:
            ov.cancel()
            fs.overlap = None
            return action
        elif voice:  # its level so far (`open` measured it up to its own micro-turn): whose voice it is
            ov.hear(fs.user_audio.since(st.tick).astype(np.float32) / 32767.0)
        ov.collect(st.tick, deadline - time.monotonic())
        ov.ended = None if voice else (st.tick if ov.ended is None else ov.ended)
        said = ruling(ov, st.tick)
        log.debug("session %s micro-turn %d: overlap since %d, P(interruption) %s, words %r: %s",
                  st.session_id, st.tick, ov.opened, ov.p_interrupt, ov.words, said)
        # What cuts the model's voice: a yield; with the flow head, any action but speak (gated to silence).
        # With the talker, silent or a backchannel only stop the writing: the phrase under way plays out.
        cut = action == YIELD or (self.flow_voice and action != SPEAK)
        if said == HOLD and cut:
            ov.held_stop = True
            return SPEAK  # a stop under a backchannel is held: it goes on speaking
        if said == STOP:
            fs.overlap = None
            ov.cancel()
            return YIELD  # the stop it was held from
        if said != HOLD and (ov.ended is not None or st.tick - ov.opened >= 2 * LONGEST_TICKS):
            ov.cancel()
            fs.overlap = None  # over, or past telling: the model decides
        return action

    # -- after the gate --------------------------------------------------------------------------------

    def settle(self, st: Seat, action: int, voice_changed: bool, fallback: Callable[[], str]) -> list[Event]:
        """What the micro-turn's action (decided, its floor state not yet updated) leaves on the floor: a turn
        check asked where the user stopped (`voice_changed`, `st.user_speaking` already the new flag), hand-offs
        (`fallback`: the query where Whisper's words are not at hand), and the user's level learnt from a turn
        the model takes. Returns the `delegate` events it emits."""
        fs, events = st.floor, []
        if voice_changed:
            self._check_turn(st)
        if fs.handing_off is not None and fs.handing_off.is_due(st.tick):
            events.append(Event("delegate", {"query": fs.handing_off.query()}))
            fs.handing_off = None
        if action == DELEGATE and st.last_action != DELEGATE and fs.handing_off is None:
            # What the recogniser heard, where the checkpoint has one (its words are real words; the tiny
            # model's transcript head is not yet), else its transcript, else the last typed text; where
            # Whisper is at hand, what it makes of the user's last words: the turn check's, which heard the same
            # clip (the user's words since the model last spoke) and settled this hand-off, at once; else its
            # own transcription, a few micro-turns later (query.py).
            query = fallback()
            checked = fs.verdict.text if fs.verdict is not None and self.query is not None else ""
            if checked:
                events.append(Event("delegate", {"query": checked[-QUERY_CHARS:]}))
            elif self.query is not None and fs.user_audio is not None:
                fs.handing_off = PendingQuery(self.query.submit(fs.user_audio.question(st.tick)), st.tick + DUE_TICKS,
                                              fallback=query)
            else:
                events.append(Event("delegate", {"query": query}))
        if action == SPEAK and fs.user_audio is not None:
            fs.user_audio.spoke_at = st.tick
        if action in (SPEAK, DELEGATE) and fs.verdict is not None:
            if fs.verdict.level is not None and fs.verdict.turn not in (onset.WAITED, onset.BYSTANDER):
                fs.user_level.learn(fs.verdict.level)  # a turn it answered on its own: the user's voice
            fs.verdict = None  # the turn is taken: the next one is judged afresh
        return events

    def _check_turn(self, st: Seat) -> None:
        """The user stopped: ask whether their words are finished (due `CHECK_DUE_TICKS` later); they spoke
        again: whatever was asked or said of the last stretch no longer counts."""
        fs = st.floor
        if fs.checking is not None:
            fs.checking.cancel()
            fs.checking = None
        fs.verdict, fs.proposal = None, None
        # Not under its own speech: a verdict counts only from silence, and one on a listener's "mm-hm" would
        # still hold when the reply ends and push it to take the floor again.
        if not st.user_speaking and not st.speaking and self.checker is not None and fs.user_audio is not None:
            fs.checking = PendingCheck(self.checker.submit(fs.user_audio.question(st.tick)),
                                       st.tick + CHECK_DUE_TICKS)

    def listen(self, st: Seat) -> None:
        """After the micro-turn's output: Whisper on the overlap so far, while the user talks over the model."""
        fs = st.floor
        if fs.overlap is not None and st.user_speaking and st.speaking and fs.user_audio and self.overlaps:
            self.overlaps.ask(fs.overlap, st.tick, fs.user_audio.since(fs.overlap.opened - LEAD_TICKS))
