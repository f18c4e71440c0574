"""The cascade voice stepped micro-turn by micro-turn (media pace) on speech synthesised at test time.

Where the background reasoner would answer, the test streams `BackgroundChunk`s itself, a few words
per micro-turn starting two micro-turns after the model's `delegate` event (a fast background).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from models.base import BackgroundChunk, TickInput, TickOutput, wait_work
from models.cascade import CascadeModel, load_cascade, parse_options
from models.speech.asr import transcribe_words
from models.speech.vad import speech_segments
from streaming.types import SAMPLE_RATE, TICK_SAMPLES
from tests.models._cascade_shared import speech

TICK = 0.2
ANSWER = (
    "Paris is the capital of France. It is famous for the Eiffel Tower and the Louvre museum. "
    "In spring the weather is mild, with temperatures around fifteen degrees. "
    "Many visitors walk along the river in the evening."
)
_ids = itertools.count()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), dtype=np.float32)


def speech_end(audio: np.ndarray, offset: float = 0.0) -> float:
    return offset + speech_segments(audio, SAMPLE_RATE)[-1][1]


def speech_start(audio: np.ndarray, offset: float = 0.0) -> float:
    return offset + speech_segments(audio, SAMPLE_RATE)[0][0]


@pytest.fixture()
def model(default_cascade: CascadeModel) -> CascadeModel:
    return default_cascade


class Conversation:
    """Drives one session; answers each `delegate` like a background reasoner would."""

    def __init__(self, model: CascadeModel, answer: str = ANSWER) -> None:
        self.m, self.s = model, model.open(f"test-{next(_ids)}")
        self.answer = answer
        self.outs: list[TickOutput] = []
        self.pending: dict[int, list[BackgroundChunk]] = {}
        self.requests = 0
        self.answer_after = 2  # micro-turns from a delegate to the answer's first words

    @property
    def n(self) -> int:
        return len(self.outs)

    def step(self, audio: np.ndarray, text: tuple[str, ...] = (), cancel: bool = False) -> TickOutput:
        tick = np.zeros(TICK_SAMPLES, dtype=np.float32)
        tick[: len(audio)] = audio[:TICK_SAMPLES]
        wait_work(self.m, [self.s])  # off-thread work as the engine's media pace waits for it
        bg = self.pending.pop(self.n, [])
        out = self.m.step([(self.s, TickInput(tick, TICK_SAMPLES, text=list(text), background=bg, cancel=cancel))])[0]
        if any(e.type == "delegate" for e in out.events):
            self._answer_from(self.n + self.answer_after)
        self.outs.append(out)
        return out

    def feed(self, audio: np.ndarray) -> None:
        for i in range(0, len(audio), TICK_SAMPLES):
            self.step(audio[i : i + TICK_SAMPLES])

    def _answer_from(self, tick: int) -> None:
        self.requests += 1
        rid, words = f"r{self.requests}", self.answer.split(" ")
        for k, i in enumerate(range(0, len(words), 4)):
            last = i + 4 >= len(words)
            chunk = BackgroundChunk(rid, self.requests, " ".join(words[i : i + 4]) + ("" if last else " "), last)
            self.pending[tick + k] = [chunk]

    def events(self, kind: str) -> list[tuple[int, dict]]:
        return [(i, e.data) for i, o in enumerate(self.outs) for e in o.events if e.type == kind]

    def loud(self, i: int) -> bool:
        return not self.outs[i].silent

    def spoken_text(self) -> str:
        return "".join(o.text for o in self.outs)


def test_question_then_silence_gets_a_prompt_reply_that_says_what_it_shows(model: CascadeModel) -> None:
    q = speech("What is the weather like in Paris today?")
    mic = np.concatenate([silence(0.4), q, silence(16)])
    c = Conversation(model)
    c.feed(mic)
    delegates = c.events("delegate")
    assert len(delegates) == 1, delegates
    assert "weather" in delegates[0][1]["query"] and "paris" in delegates[0][1]["query"]
    started, stopped = c.events("speech_started"), c.events("speech_stopped")
    assert len(started) == 1 and len(stopped) == 1 and started[0][0] < stopped[0][0]
    # The pause's transcript is the final one: the question is delegated in the micro-turn the turn ends.
    assert delegates[0][0] == stopped[0][0]
    assert c.outs[delegates[0][0]].user_text == delegates[0][1]["query"]
    # Latency: the acknowledgment starts in the micro-turn of the end of turn, whose input ends at
    # most 0.6 s (the floor) after the user's last speech: words and Smart Turn agree at once.
    first = next(i for i in range(c.n) if c.loud(i))
    latency = (first + 1) * TICK - speech_end(mic)
    assert first == stopped[0][0]
    assert latency <= 0.6, latency
    # The whole streamed answer was spoken, and what was heard is what the transcript says.
    said = c.spoken_text()
    assert "Many visitors walk along the river" in said
    audio = np.concatenate([o.audio for o in c.outs])
    heard = [w for w, _, _ in transcribe_words(audio, SAMPLE_RATE)]
    expected = [w.strip(".,?!").lower() for w in said.split()]
    hits = sum(1 for w in expected if w in heard)
    assert hits / len(expected) >= 0.8, (said, heard)


def test_mid_sentence_pause_is_not_an_end_of_turn(model: CascadeModel) -> None:
    a, b = speech("What is the weather like in"), speech("Paris today?")
    mic = np.concatenate([silence(0.4), a, silence(0.6), b, silence(3)])
    c = Conversation(model)
    c.feed(mic)
    resume = speech_start(b, offset=0.4 + len(a) / SAMPLE_RATE + 0.6)
    during = [i for i in range(c.n) if (i + 1) * TICK <= resume + TICK]
    assert not any(c.loud(i) for i in during), "the assistant spoke into the pause"
    assert all(i > during[-1] for i, _ in c.events("delegate"))
    (_, data), *rest = c.events("delegate")
    # One turn, holding words from both sides of the pause.
    # (Piper samples noise, so each run hears a slightly different "Paris today": pocketsphinx
    # sometimes writes it "an airstrip date"; what matters is that words after the pause are in.)
    assert not rest and "weather" in data["query"] and len(data["query"].split()) >= 7, data


def _talking(model: CascadeModel, answer: str = ANSWER) -> Conversation:
    """A conversation in which the assistant has been answering for about two seconds."""
    c = Conversation(model, answer)
    c.feed(np.concatenate([silence(0.4), speech("Tell me about Paris."), silence(0.8)]))
    for _ in range(10):  # with Whisper the question is delegated a few micro-turns after the ack
        if c.events("delegate"):
            break
        c.step(silence(TICK))
    assert c.events("delegate")
    while sum(c.loud(i) for i in range(c.n)) < 12:
        c.step(silence(TICK))
    assert c.loud(c.n - 1)
    return c


def test_user_talking_over_a_long_reply_stops_it_within_one_micro_turn(model: CascadeModel) -> None:
    c = _talking(model)
    t0 = c.n * TICK
    cut = speech("Wait, stop. I have a different question about trains to London.")
    c.feed(np.concatenate([cut, silence(3)]))
    (decided, data), *more = c.events("yielded")
    assert not more and data["reason"] == "barge_in" and "Many visitors" in data["dropped"]
    onset = speech_start(cut, offset=t0)
    # Dropped within barge_in_max_ms (+ VAD lag and tick granularity) of the user's first word ...
    assert decided * TICK - onset <= model.opts.barge_in_max_ms / 1000 + 0.3
    # ... but silent much sooner: the audio stops (pauses) in the micro-turn in which the overlap
    # reaches barge_in_pause_ms of speech, and stays silent until the user has finished and the
    # assistant acknowledges the new question.
    stop = next(i for i in range(int(t0 / TICK), c.n) if not c.loud(i))
    assert c.loud(stop - 1) and stop * TICK - onset <= model.opts.barge_in_pause_ms / 1000 + 0.3, (stop, onset)
    # The new turn is taken (acknowledged) at its end of turn; with Whisper, delegated a bit later.
    new_turn = next(i for i, d in c.events("speech_stopped") if i > decided)
    # The one sound allowed before the new answer: a backchannel in a pause of the user's long new
    # turn (it happens when pocketsphinx ends the partial on an incomplete-looking word).
    bcs = [i for i, _ in c.events("backchannel") if stop <= i < new_turn]
    assert not any(c.loud(i) for i in range(stop, bcs[0] if bcs else new_turn))
    said = [c.outs[i].text.strip() for i in range(stop, new_turn) if c.outs[i].text]
    assert all(t in model.opts.backchannel_phrases for t in said), said
    assert "Many visitors" not in c.spoken_text()
    assert "london" in c.events("delegate")[-1][1]["query"]


@pytest.mark.parametrize("backchannel", ["Mm-hm.", "Yeah."])
def test_user_backchannel_does_not_stop_the_reply(model: CascadeModel, backchannel: str) -> None:
    c = _talking(model)
    c.feed(speech(backchannel))
    for _ in range(150):
        c.step(silence(TICK))
        if "Many visitors walk along the river" in c.spoken_text() and c.outs[-1].silent:
            break
    assert not c.events("yielded")
    assert len(c.events("delegate")) == 1
    assert "Many visitors walk along the river" in c.spoken_text()


def test_its_own_echo_is_not_the_user(model: CascadeModel) -> None:
    c = _talking(model)
    # The microphone hears the assistant half as loud, 1.3 micro-turns late.
    delay = TICK_SAMPLES + 1440
    start = c.n
    for _ in range(60):
        played = np.concatenate([o.audio for o in c.outs])
        mic = 0.5 * played[len(played) - delay : len(played) - delay + TICK_SAMPLES]
        c.step(mic.astype(np.float32))
    assert not c.events("yielded")
    assert not [i for i, _ in c.events("speech_started") if i >= start]
    assert sum(c.loud(i) for i in range(start, c.n)) > 30


def test_typed_text_is_a_question_and_cancel_stops_the_answer(model: CascadeModel) -> None:
    c = Conversation(model)
    out = c.step(silence(TICK), text=("What time is it?",))
    assert out.user_text == "What time is it?" and not out.silent
    assert [e.data["query"] for e in out.events if e.type == "delegate"] == ["What time is it?"]
    while "Paris is the capital" not in c.spoken_text():
        c.step(silence(TICK))
    out = c.step(silence(TICK), cancel=True)
    assert out.silent and [e.data["reason"] for e in out.events if e.type == "yielded"] == ["cancel"]
    c.feed(silence(3))
    assert not any(c.loud(i) for i in range(c.n - 15, c.n))


def test_say_mode_speaks_typed_text(model: CascadeModel) -> None:
    # Both options are read where they act (each step), so the shared model serves: loading a model of
    # its own ("typed_text=say,ack=false,asr=sphinx") cost this test 5-15 s.
    plain = model.opts
    model.opts = replace(plain, typed_text="say", ack=False)
    try:
        assert model.opts.typed_text == "say" and not model.opts.ack
        c = Conversation(model)
        c.step(silence(TICK), text=("Hello from the cascade.",))
        c.feed(silence(3))
        assert "Hello from the cascade." in c.spoken_text() and not c.events("delegate")
    finally:
        model.opts = plain


def test_options_parse_and_name_their_errors() -> None:
    o = parse_options("espeak,eot_silence_ms=700,ack_phrases=Okay.|Right.")
    assert o.voice == "espeak:en-us" and o.eot_silence_ms == 700 and o.ack_phrases == ("Okay.", "Right.")
    with pytest.raises(ValueError, match="unknown cascade option 'eot'"):
        parse_options("eot=3")
    with pytest.raises(ValueError, match="not a valid int"):
        parse_options("eot_silence_ms=soon")
    with pytest.raises(ValueError, match="unknown cascade preset 'loud'"):
        parse_options("loud")
    with pytest.raises(ValueError, match="eot_max_silence_ms must be >= eot_silence_ms"):
        parse_options("eot_silence_ms=2000")


def test_backchannel_at_a_pause_in_a_long_turn_never_over_the_user(model: CascadeModel) -> None:
    # A long turn (> backchannel_after_ms of speech) with a 0.7 s pause after "and": not an end of
    # turn (the transcript is incomplete), so the listener says "mm-hm" in the pause. The pause is
    # shorter than pause detection + the phrase, so the user resumes over it: it must stop then.
    a = speech("Yesterday I went to the market in the old town to buy some vegetables for dinner and")
    b = speech("then I met an old friend.")
    # 4 s after: Smart Turn hears a story going on (P(end) ~0.04), so the turn ends only after the
    # eagerness' longest silence (3 s).
    mic = np.concatenate([silence(0.4), a, silence(0.7), b, silence(4)])
    pause_start, resume = speech_end(a, 0.4), speech_start(b, 0.4 + len(a) / SAMPLE_RATE + 0.7)
    assert pause_start - 0.4 >= model.opts.backchannel_after_ms / 1000  # the turn is long enough
    c = Conversation(model, answer="Nice.")  # a short answer: this test is about the user's turn
    c.feed(mic)
    (b_tick, data), *more = c.events("backchannel")
    assert not more and data["text"] == model.opts.backchannel_phrases[0]
    # Said in the pause: its micro-turn's input is silence, at most VAD lag + one micro-turn after
    # the pause grew to backchannel_pause_ms.
    # (The streaming VAD's hysteresis ends speech up to ~100 ms before the offline segmenter does.)
    assert pause_start + model.opts.backchannel_pause_ms / 1000 - 0.1 <= (b_tick + 1) * TICK <= resume
    assert (b_tick + 1) * TICK <= pause_start + model.opts.backchannel_pause_ms / 1000 + 0.4
    # Until the end of the turn the only audio is the backchannel, and it stops at the latest in the
    # micro-turn after the one in which the user resumed (detection needs min_speech_ms of speech).
    (answer_tick, _), *_ = c.events("speech_stopped")  # the end of turn, where the ack starts
    loud = [i for i in range(answer_tick) if c.loud(i)]
    assert loud == list(range(b_tick, loud[-1] + 1)), loud
    assert loud[-1] <= int(resume / TICK) + 1, (loud, resume)
    phrase = model.synth.cached(data["text"])
    assert phrase is not None and resume - b_tick * TICK < len(phrase) / SAMPLE_RATE  # it could not fit ...
    played = sum(int(np.count_nonzero(c.outs[i].audio)) for i in loud)
    assert played < len(phrase)  # ... so it was cut short
    # One user turn across the pause, and the backchannel did not take the floor from it.
    assert len(c.events("speech_started")) == 1 and not c.events("yielded")
    assert answer_tick * TICK > speech_end(mic)
    assert "market" in c.events("delegate")[0][1]["query"] and "friend" in c.events("delegate")[0][1]["query"]


def test_the_model_starts_every_thread_at_load_so_a_session_adds_none() -> None:
    """A soak compares the server's threads at the end with those before the first session: worker
    pools that started threads on first use looked like a leak of 5 threads."""
    import threading

    m = load_cascade("")
    try:
        before = threading.active_count()
        c = Conversation(m)
        c.feed(np.concatenate([speech("What is the weather like in Paris today?"), silence(6)]))
        assert c.events("delegate") and "capital" in c.spoken_text()  # Smart Turn, Whisper and TTS ran
        m.close(c.s)
        assert threading.active_count() == before
    finally:
        m.shutdown()
