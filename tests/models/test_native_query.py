"""models/interaction/query.py: a native hand-off's query is Whisper's words for what the user just said."""

from concurrent.futures import Future

import numpy as np
import torch

from models.base import TickInput
from models.interaction import NativeModel
from models.interaction.query import DUE_TICKS, KEEP_TICKS, PendingQuery, QueryTranscriber, UserAudio
from models.speech.tts import synthesize
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SAMPLES
from tests.models.test_interaction_core import one_thread, small_net  # noqa: F401 - fixture
from tests.models.test_onset import _set_probs

SILENCE = np.zeros(TICK_SAMPLES, dtype=np.float32)
QUIET = [0.15, 0.6, 0.0001, 0.0001, 0.2498]  # silent wins; p(delegate) 0.25


def _ticks(audio: np.ndarray) -> list[np.ndarray]:
    n = -(-len(audio) // TICK_SAMPLES)
    return list(np.pad(audio, (0, n * TICK_SAMPLES - len(audio))).reshape(n, TICK_SAMPLES))


def test_the_question_is_the_users_audio_since_the_model_last_spoke() -> None:
    ua = UserAudio()
    for t in range(KEEP_TICKS + 20):
        ua.add(t, np.full(TICK_SAMPLES, t / 1000, dtype=np.float32))
    last = KEEP_TICKS + 19

    def first_tick(q: np.ndarray) -> int:
        return round(q[0] / 32767 * 1000)

    q = ua.question(last)
    assert len(q) == KEEP_TICKS * TICK_SAMPLES and first_tick(q) == 20, "never more than the last 10 s"
    ua.spoke_at = last - 20  # it spoke 4 s ago: from 0.4 s before it stopped
    assert first_tick(ua.question(last)) == last - 20 + 1 - 2
    ua.spoke_at = last - 1  # it spoke just now: still the last 2 s
    assert len(ua.question(last)) == 11 * TICK_SAMPLES
    assert ua.question(last - 5)[-1] == round((last - 5) / 1000 * 32767), "nothing after the hand-off's micro-turn"


def test_a_late_or_failed_transcription_hands_off_the_recognisers_words() -> None:
    late: Future[str] = Future()
    assert PendingQuery(late, 3, fallback="heard words").query() == "heard words" and late.cancelled()
    failed: Future[str] = Future()
    failed.set_exception(RuntimeError("model gone"))
    assert PendingQuery(failed, 3, fallback="heard words").query() == "heard words"
    empty: Future[str] = Future()
    empty.set_result("")
    assert PendingQuery(empty, 3, fallback="heard words").query() == "heard words", \
        "Whisper heard nothing: no empty query"


def test_no_speech_in_the_question_gives_no_words() -> None:
    """A typed request, or a mic with only silence or noise in it: Whisper is not asked (it would make up
    words there), so the recogniser's words or the typed text go instead."""
    query = QueryTranscriber()
    try:
        noise = (np.random.default_rng(0).standard_normal(3 * SAMPLE_RATE) * 0.01 * 32767).astype(np.int16)
        assert query.submit(np.zeros(3 * SAMPLE_RATE, dtype=np.int16)).result(timeout=30) == ""
        assert query.submit(noise).result(timeout=30) == ""
        typed: Future[str] = Future()
        typed.set_result("")
        assert PendingQuery(typed, 3, fallback="when does the pool close?").query() == "when does the pool close?"
    finally:
        query.shutdown()


def test_a_served_hand_off_carries_whisper_words_a_fixed_number_of_micro_turns_later() -> None:
    """Real speech in, a real Whisper: the `delegate` event comes DUE_TICKS after the decision (the engine
    waits for `pending_work` in media pace, as here), with the question's words."""
    audio, rate = synthesize("Can you check when the swimming pool closes?", "piper:joe")
    speech = _ticks(resample(audio, rate, SAMPLE_RATE))
    net = small_net(seed=6)
    _set_probs(net, QUIET)
    query = QueryTranscriber()
    model = NativeModel(net, "native:test", 2, torch.device("cpu"), deterministic=True, query=query)
    st = model.open("q")
    try:
        outs = [model.step([(st, TickInput(a, TICK_SAMPLES))])[0] for a in [SILENCE] * 3 + speech + [SILENCE]]
        assert not any(e.type == "delegate" for o in outs for e in o.events), "0.25 < silent's 0.6: no hand-off"
        model.delegate = 0.2  # from here p(delegate) 0.25 hands off: at the end of the question
        decided = st.tick
        for _ in range(DUE_TICKS + 2):
            for f in model.pending_work(st):
                f.result(timeout=30)
            outs.append(model.step([(st, TickInput(SILENCE, TICK_SAMPLES))])[0])
        events = [(i, e.data["query"]) for i, o in enumerate(outs) for e in o.events if e.type == "delegate"]
        assert len(events) == 1, events
        at, words = events[0]
        assert at == decided + DUE_TICKS
        assert {"check", "swimming", "pool", "closes"} <= set(words.lower().replace("?", "").split()), words
        assert not model.pending_work(st)
    finally:
        model.close(st)
        model.shutdown()
