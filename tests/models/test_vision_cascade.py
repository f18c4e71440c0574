"""The default voice with a camera, in process (media pace), with the real vision worker: a spoken question
waits for the reading of the picture, and an answer held while the user was away is offered, not
resumed mid-sentence, when they come back after a long absence.

Speech is synthesised at test time; the background reasoner is the test's (`Conversation`)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.vision.clips import backgrounds
from bench.vision.cost import text_card
from bench.vision.reactions import FLOORS, Trial, run_trial
from models.base import TickInput, TickOutput, wait_work
from models.cascade import CascadeModel
from streaming.types import TICK_SAMPLES
from tests.models.test_cascade import ANSWER, TICK, Conversation, silence, speech
from tests.models.test_vision_models import astronaut

GREY = np.full((480, 640, 3), 90, np.uint8)  # a wall: no face, no text


class SeeingConversation(Conversation):
    """A `Conversation` whose client sends `frame` with every micro-turn (5 a second, the camera's rate)."""

    def __init__(self, model: CascadeModel, frame: np.ndarray | None = None) -> None:
        super().__init__(model)
        self.frame = frame

    def step(self, audio: np.ndarray, text: tuple[str, ...] = (), cancel: bool = False) -> TickOutput:
        tick = np.zeros(TICK_SAMPLES, dtype=np.float32)
        tick[: len(audio)] = audio[:TICK_SAMPLES]
        wait_work(self.m, [self.s])  # off-thread work, the vision worker's included, as media pace waits for it
        bg = self.pending.pop(self.n, [])
        out = self.m.step([(self.s, TickInput(tick, TICK_SAMPLES, video=self.frame, text=list(text),
                                              background=bg, cancel=cancel))])[0]
        if any(e.type == "delegate" for e in out.events):
            self._answer_from(self.n + self.answer_after)
        self.outs.append(out)
        return out


@pytest.fixture()
def model(default_cascade: CascadeModel) -> CascadeModel:
    return default_cascade


def test_a_spoken_question_waits_for_the_reading_of_the_sign_held_up_as_it_ends(model: CascadeModel) -> None:
    """The sign comes into view in the micro-turn the question ends: the reading asked when the turn
    began saw a wall, so the question must wait for a new one (the typed path's rule, on the spoken path)."""
    mic = np.concatenate([silence(0.4), speech("What does this sign say?"), silence(2.0)])
    ticks = [mic[i : i + TICK_SAMPLES] for i in range(0, len(mic), TICK_SAMPLES)]
    blind = Conversation(model)  # where the turn ends, without a camera (the policy does not look)
    for x in ticks:
        blind.step(x)
        if blind.events("speech_stopped"):
            break
    assert blind.events("speech_stopped"), "the question's turn never ended"
    end = blind.events("speech_stopped")[0][0]

    c = SeeingConversation(model, GREY)
    for i, x in enumerate(ticks):
        if i == end:
            c.frame = text_card("EXIT")
        c.step(x)
        if c.events("delegate"):
            break
    # The same audio ends the turn in the same micro-turn (media pace); later would still find the sign.
    assert c.events("speech_stopped")[0][0] >= end, "the turn ended before the sign was held up"
    delegates = c.events("delegate")
    assert len(delegates) == 1 and "sign" in delegates[0][1]["query"], delegates
    facts = [(i, d["facts"]) for i, d in c.events("vision") if "facts" in d]
    assert facts and facts[-1][0] == delegates[0][0], (facts, delegates)
    assert 'text in view: "EXIT"' in facts[-1][1], f"the question went on before the reading: {facts}"
    assert delegates[0][0] - end <= 8, "waited longer than READ_WAIT_TICKS"
    model.close(c.s)
    model.close(blind.s)


def test_back_after_a_long_absence_it_offers_to_go_on_and_yes_goes_on_from_the_sentence_start(
        model: CascadeModel) -> None:
    """The astronaut (a real photo, the real detectors) asks, listens, leaves for longer than the bound
    (1 s here), and comes back: the answer is not resumed mid-sentence; it asks, and "yes, please" hears
    the sentence it was cut in from its start."""
    face = astronaut()
    bound, model.opts.resume_offer_s = model.opts.resume_offer_s, 1.0  # the shared model's: put back below
    c = SeeingConversation(model, face)
    try:
        c.feed(np.concatenate([silence(0.4), speech("Tell me about Paris."), silence(0.6)]))
        while sum(c.loud(i) for i in range(c.n)) < 9:  # the acknowledgment, then some of the answer
            c.step(silence(TICK))
            assert c.n < 80, "the assistant never spoke the answer"
        c.frame = GREY
        away = c.n
        c.feed(silence(1.8))
        assert c.events("vision") and "left" in [cue for _, d in c.events("vision") for cue in d["cues"]]
        assert not any(c.loud(i) for i in range(away + 3, c.n)), "held while she is away"
        held = next(i for i in range(away, c.n) if not c.loud(i))
        cut_in = [o.text for o in c.outs[:held] if o.text][-1].strip()  # the sentence it was saying
        assert cut_in in ANSWER, cut_in
        c.frame = face
        back = c.n
        c.feed(silence(2.6))
        offers = c.events("resume_offer")
        assert offers and offers[0][0] <= back + 3, offers
        after_offer = "".join(o.text for o in c.outs[back:])
        assert "Shall I go on?" in after_offer and cut_in not in after_offer, after_offer
        reply = c.n
        c.feed(np.concatenate([speech("Yes, please."), silence(2.4)]))
        assert [d["reply"] for _, d in c.events("resume_reply")] == ["yes"], c.events("resume_reply")
        assert not c.events("yielded") and len(c.events("delegate")) == 1, "a yes is not a new question"
        assert cut_in in "".join(o.text for o in c.outs[reply:]), "the sentence it was cut in, from its start"
    finally:
        model.opts.resume_offer_s = bound
        model.close(c.s)


def test_leaving_the_picture_pauses_within_the_issue_s_bound_in_bench_vision_reactions_terms(
        model: CascadeModel) -> None:
    """bench.vision.reactions' leave trial (a real face in a room, then the room alone; the real detectors
    and worker; media pace) at the worst camera phase, a frame taken as its micro-turn begins: the answer
    is silent from 0.6 s after that first frame without the person, and stays so (the issue's floor)."""
    trial = Trial("leave", fps=5.0, lead=2, onset=0.5, phase=0.0, room=1, picture="astronaut_head.jpg", scale=0.8,
                  offset=(0.5, 0.5), hand=(0.5, 0.5))
    r = run_trial(model, trial, backgrounds())
    assert r.seen_before and r.talking_before, r
    assert r.cues[:1] == ["left"] and not r.kept_talking, r
    assert r.silent_s is not None and r.silent_s <= FLOORS["leave"] + 1e-9, r
    assert r.event_s == r.silent_s, "held in the micro-turn that saw her gone"
