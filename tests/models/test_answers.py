"""models/cascade/answers.py: a new question drops the answers to the questions asked before it, also
those whose first words had not arrived when it took the floor."""

from __future__ import annotations

from models.base import BackgroundChunk, Event
from models.cascade.answers import AnswerState
from models.cascade.options import CascadeOptions
from models.speech.speaker import Speaker, Synthesizer


def test_a_new_question_drops_the_answer_to_an_earlier_one_not_begun_yet() -> None:
    """The reasoner's answer to the earlier question can reach the cascade after the new question took the
    floor (drained into micro-turns taken before the worker had the new request): it is never said."""
    synth = Synthesizer("espeak:en-us", "espeak:en-us", 1)
    try:
        a, o, ev = AnswerState(Speaker(synth, 300, 0.0)), CascadeOptions(), list[Event]()
        first = a.number_question()  # "stop, wait a moment" goes to the reasoner
        a.take_floor(o)  # a typed request: acknowledged; its own question is numbered next
        ack = [p.text for p in a.speaker.queue]
        a.add_chunk(BackgroundChunk("r1", 1, "Paris is the capital. It is old.", done=True, ask=first), "sorry", ev)
        assert [p.text for p in a.speaker.queue] == ack, "the earlier question's answer must not be said"
        second = a.number_question()
        a.add_chunk(BackgroundChunk("r2", 2, "It is sunny.", done=True, ask=second), "sorry", ev)
        assert [p.text for p in a.speaker.queue] == [*ack, "It is sunny."]
        # A chunk the foreground did not number (the client's own request) is taken as before.
        a.add_chunk(BackgroundChunk("r3", 3, "Noted.", done=True), "sorry", ev)
        assert [p.text for p in a.speaker.queue][-1] == "Noted."
    finally:
        synth.close()
