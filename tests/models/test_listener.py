"""The heard-words channel's recogniser (models/interaction/listener.py) on real speech: pocketsphinx in
an ASR worker process as served, and in-process as training runs it, give the model the same bytes."""

import numpy as np
import pytest

from models.interaction.config import NO_BYTE
from models.interaction.listener import Listener, hear_track
from streaming.types import TICK_SAMPLES
from train.episodes import Speaker

UNFINISHED = "I would like to go to the park because"
LEAD, TAIL = 2, 14  # micro-turns of silence before and after


@pytest.fixture(scope="module")
def track() -> tuple[np.ndarray, int]:
    """Piper joe saying an unfinished clause, padded; and the micro-turn its speech ends in."""
    speech = Speaker().say(UNFINISHED, "piper:joe")
    x = np.concatenate([np.zeros(LEAD * TICK_SAMPLES, np.float32), speech, np.zeros(TAIL * TICK_SAMPLES, np.float32)])
    end = (LEAD * TICK_SAMPLES + len(speech) - 1) // TICK_SAMPLES
    return x[: len(x) // TICK_SAMPLES * TICK_SAMPLES], end


def _words(rows: list[list[int]]) -> list[tuple[int, str]]:
    """(micro-turn, word) each time the channel's value changes."""
    seen = [bytes(b for b in r if b != NO_BYTE).decode() for r in rows]
    return [(t, w) for t, w in enumerate(seen) if w and (t == 0 or w != seen[t - 1])]


def test_training_hears_what_serving_hears(track: tuple[np.ndarray, int]) -> None:
    x, end = track
    trained = hear_track(x, 4)
    listener = Listener(4, processes=1)  # the server's: a worker process, collected a micro-turn late
    try:
        served = hear_track(x, 4, listener)
    finally:
        listener.shutdown()
    assert served == trained
    changes = _words(trained)
    assert len(changes) >= 4, f"words stream in as they are said: {changes}"
    assert changes[0][0] < end - 2, changes
    # The clause's last word is held through the pause, from two or three micro-turns after it ends.
    last_t, last = changes[-1]
    assert last == "beca", changes
    assert end + 1 <= last_t <= end + 3, (end, changes)
    assert bytes(b for b in trained[-1] if b != NO_BYTE) == b"beca"


def test_a_native_session_reads_what_its_recogniser_heard(track: tuple[np.ndarray, int]) -> None:
    """Through NativeModel.step (the server's adapter): each micro-turn's heard bytes are the listener's."""
    import torch

    from models.base import TickInput
    from models.interaction import NativeModel, TickFeatures
    from tests.models.test_interaction_core import small_cfg, small_net

    x, _ = track
    with pytest.raises(ValueError, match="listener"):
        NativeModel(small_net(small_cfg(heard_tokens=4)), "native:test", 2, torch.device("cpu"), True)
    model = NativeModel(small_net(small_cfg(heard_tokens=4)), "native:test", 2, torch.device("cpu"), True,
                        listener=Listener(4, processes=1))
    seen: list[list[int]] = []

    def observe(_st: object, f: TickFeatures, _h: object) -> None:
        assert f.heard is not None
        seen.append(f.heard[0].tolist())

    transcript: list[str] = []
    try:
        st = model.open("heard")
        for t in range(len(x) // TICK_SAMPLES):
            out = model.step([(st, TickInput(x[t * TICK_SAMPLES : (t + 1) * TICK_SAMPLES], TICK_SAMPLES))],
                             observe=observe)[0]
            transcript += [out.user_text] if out.user_text else []
        assert st.hear is not None
        committed = list(st.hear.words)
        model.close(st)
    finally:
        model.shutdown()
    assert seen == hear_track(x, 4)
    # The user's transcript is the recogniser's words, each once, in order, as they were committed (the
    # model's own transcript head, random here, has no say).
    said = " ".join(transcript).split()
    assert said == committed, (transcript, committed)
    assert {"park", "because"} <= set(said), transcript
