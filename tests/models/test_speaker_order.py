"""The synthesis pool serves the phrase needed soonest first (models/speech/speaker.py): with several
sessions answering at once, one session's first sentence must not wait behind another's later ones."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import numpy as np
import pytest

from models.speech.speaker import Speaker, Synthesizer


@pytest.fixture(scope="module")
def synth() -> Iterator[Synthesizer]:
    s = Synthesizer("piper:joe", "espeak:en-us", workers=1)
    s.horizon = 1e6  # everything queued is within reach: the order alone is what these tests see
    yield s
    s.close()


def _record(futures: dict[str, Future[np.ndarray]], done: list[str]) -> None:
    lock = threading.Lock()
    for name, f in futures.items():
        def note(_: Future[np.ndarray], name: str = name) -> None:
            with lock:
                done.append(name)
        f.add_done_callback(note)


def test_a_first_sentence_is_synthesised_before_another_sessions_later_ones(synth: Synthesizer) -> None:
    a, b = Speaker(synth), Speaker(synth)
    # Session A's three-sentence answer arrives first, then session B's first sentence: B's is needed
    # now, A's second and third only once A's first has played.
    phrases = {
        "a1": a.say("The moon is about three hundred eighty thousand kilometres away.", "answer"),
        "a2": a.say("Light from it takes a little over a second to reach us.", "answer"),
        "a3": a.say("That is why radio calls to astronauts had a short delay.", "answer"),
        "b1": b.say("A good name for a small gray cat is Misty.", "answer"),
    }
    futures = {k: p.future for k, p in phrases.items() if p.future is not None}
    assert len(futures) == 4
    done: list[str] = []
    _record(futures, done)
    for f in futures.values():
        assert len(f.result(timeout=60)) > 0.5 * 24_000  # every phrase is real speech
    # a1 may already be running when b1 arrives; b1 never waits for a2 or a3.
    assert done.index("b1") < done.index("a2") < done.index("a3"), done


def test_a_dropped_phrase_is_never_synthesised(synth: Synthesizer) -> None:
    a = Speaker(synth)
    first = a.say("Here is a long first sentence that keeps the only worker busy for a while.", "answer")
    later = a.say("This sentence is dropped before its turn.", "answer")
    assert first.future is not None and later.future is not None
    a.drop()  # a barge-in: everything queued goes
    assert later.future.cancelled()
    b = Speaker(synth)
    other = b.say("Another session goes on.", "answer")
    assert other.future is not None and len(other.future.result(timeout=60)) > 0
    assert later.future.cancelled()  # popped and skipped, not rendered


def test_phrases_queued_ahead_set_when_a_new_one_is_needed(synth: Synthesizer) -> None:
    s = Speaker(synth)
    assert s.seconds_queued("answer") == 0.0
    s.say("Okay.", "answer")  # not cached in this synthesizer: pending, estimated from its text
    pending = s.seconds_queued("answer")
    assert pending > 0.0
    assert s.seconds_queued("backchannel") == 0.0  # a backchannel goes to the front of the queue
    s.queue[0].audio, s.queue[0].future = np.zeros(24_000, np.float32), None  # rendered: one second left
    s.queue[0].pos = 12_000
    assert s.seconds_queued("answer") == pytest.approx(0.5)


def test_a_phrase_needed_later_waits_until_it_is_near_or_hurried() -> None:
    lazy = Synthesizer("piper:joe", "espeak:en-us", workers=1)
    try:
        lazy.horizon = 1.0
        later = lazy.submit("Needed in a minute.", time.monotonic() + 60.0)
        soon = lazy.submit("Needed now.")
        assert len(soon.result(timeout=60)) > 0
        time.sleep(0.2)
        assert not later.running() and not later.done()  # a minute away: not started
        speaker = Speaker(lazy)
        p = speaker.say("A phrase due at once.", "answer")
        assert p.future is not None
        p.due = speaker.tick  # its due micro-turn came (media pace gets there before the wall clock)
        assert speaker.waiting() == [p.future]
        lazy.hurry(later)  # needed now: it goes next
        assert len(later.result(timeout=60)) > 0 and len(p.future.result(timeout=60)) > 0
    finally:
        lazy.close()
