"""models/cascade/grounding.py: an answer about what is seen is said only if it keeps to the perception
facts; else the facts are said. The answers are the ones a small reasoner gave (the issue's), the facts
those the detectors gave for the same pictures."""

from __future__ import annotations

from models.base import BackgroundChunk, Event
from models.cascade.answers import AnswerState
from models.cascade.grounding import Facts, check, fallback, kind_of
from models.speech.speaker import Speaker, Synthesizer

CARD = Facts(False, 0, None, None, ("PLATFORM 9", "LEAVES 4:15"),
             'Picture: nobody is in view; text in view: "PLATFORM 9"; "LEAVES 4:15".')
HAND = Facts(True, 1, "open_palm", 5, (),
             "Camera: a person is in view, looking at the camera; gesture: open palm; fingers held up: 5.")
EMPTY = Facts(False, 0, None, None, (), "Camera: nobody is in view.")
READ = "What does the card I'm holding say?"
COUNT = "How many fingers am I holding up?"


def test_made_up_half_and_wrong_answers_are_not_said_and_the_facts_are() -> None:
    for answer in ("The card I'm holding says 'A new laptop model with a 32GB of RAM.'",
                   "The card I am holding says 'Platform 9' and it's a laptop.",
                   "It says Platform 9."):  # half the text
        assert not check(READ, answer, CARD).ok, answer
    assert fallback(READ, CARD) == 'It says "PLATFORM 9, LEAVES 4:15".'
    assert not check(COUNT, "You are correct, the answer is 10.", HAND).ok
    assert not check(COUNT, "You're holding up four fingers.", HAND).ok
    assert fallback(COUNT, HAND) == "You're holding up 5 fingers."
    assert not check("Is anyone there?", "Yes, I can see you.", EMPTY).ok
    assert not check("Is anyone there?", "I'm here. I'm here.", HAND).ok  # the embedded reasoner's, about itself
    assert fallback("Is anyone there?", EMPTY) == "Nobody is in view."
    assert not check("What am I holding up?", "You're holding up a thumbs up.", HAND).ok


def test_answers_that_keep_to_the_facts_are_said_as_the_reasoner_gave_them() -> None:
    assert check(READ, "The card says PLATFORM 9, LEAVES 4:15.", CARD).ok
    assert check(READ, "It says platform nine, leaves four fifteen.", CARD).ok
    assert check(COUNT, "You're holding up five fingers.", HAND).ok
    assert check("Is anyone there?", "Yes, a person is in view.", HAND).ok
    assert check("Is anyone there?", "No, nobody is in view.", EMPTY).ok
    # Not about what is seen: not checked at all.
    assert kind_of("What is the capital of France?") is None
    assert check("What is the capital of France?", "Paris, of course, since 1944.", CARD).ok


def test_a_grounded_answer_is_held_until_whole_and_the_facts_are_said_instead() -> None:
    """Through the cascade's answer queue with a real (espeak) synthesizer: the made-up answer's sentences
    are never queued; the facts are, and a `grounding` event says what was replaced."""
    synth = Synthesizer("espeak:en-us", "espeak:en-us", 1)
    try:
        a = AnswerState(Speaker(synth, 300, 0.0))
        a.ground(COUNT, HAND)
        ev: list[Event] = []
        a.add_chunk(BackgroundChunk("r1", 1, "You are correct. "), "sorry", ev)
        assert not a.speaker.queue, "a grounded answer must wait until it is whole"
        a.add_chunk(BackgroundChunk("r1", 1, "The answer is 10.", done=True), "sorry", ev)
        assert [p.text for p in a.speaker.queue] == ["You're holding up 5 fingers."]
        (g,) = [e.data for e in ev if e.type == "grounding"]
        assert g["answer"] == "You are correct. The answer is 10." and not g["kept"]
        # The next question, not about what is seen, streams as before.
        a.add_chunk(BackgroundChunk("r2", 2, "Paris is the capital. It is"), "sorry", ev)
        assert [p.text for p in a.speaker.queue][-1] == "Paris is the capital."
    finally:
        synth.close()
