"""The native model's Piper talker (models/interaction/talker.py) and its phrase-constrained text
(phrases.py): real Piper, real model steps on a small seeded net. That the words are heard as words
(Whisper) is checked through the real server, tests/train/test_shipped.py."""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from models.base import BackgroundChunk, TickInput, TickOutput
from models.interaction import InteractionTransformer, NativeModel, NativeSession, save_checkpoint
from models.interaction.checkpoint import checkpoint_metadata
from models.interaction.config import ACTIONS, NO_BYTE
from models.interaction.dmel import CONTEXT, DMelFrontend
from models.interaction.model import HeadOutputs, TickFeatures
from models.interaction.phrases import (
    MAX_CHAINED,
    TRAINED_ANSWER_LEAD,
    TRAINED_REPLIES,
    PhraseSet,
    PhraseWriter,
)
from models.interaction.talker import PiperTalker
from models.interaction.voice import FLOW_MAX_WER, choose_voice
from tests.models.test_interaction_core import one_thread, small_net  # noqa: F401 - fixture

CPU = torch.device("cpu")
SILENCE = np.zeros(4800, dtype=np.float32)
# Two replies keep the talker's pre-rendering to ~1 s (the trained set's 22 phrases take ~13 s here).
PHRASES = PhraseSet(("Sure, I can help with that.", "No problem at all."), TRAINED_ANSWER_LEAD)
ANSWER = "The library opens at nine."


def test_voice_auto_picks_per_the_checkpoint_metadata(tmp_path: Path) -> None:
    trained = {"trainer": "train.cli"}
    assert choose_voice("auto", trained)[0] == "piper", "no measured word error: the flow head has not earned it"
    assert choose_voice("auto", {})[0] == "flow", "untrained weights: no text to speak"
    assert choose_voice("auto", {"phrase_word_error": "1.0"})[0] == "piper"
    assert choose_voice("auto", {"phrase_word_error": str(FLOW_MAX_WER)})[0] == "flow"
    assert choose_voice("flow", {})[0] == "flow" and choose_voice("piper", {"phrase_word_error": "0"})[0] == "piper"
    with pytest.raises(ValueError, match="--voice"):
        choose_voice("loud", {})
    path = tmp_path / "c.safetensors"  # the export path records both fields; auto reads them back
    save_checkpoint(small_net(), path, "tiny", phrase_wer=0.08, phrases=PHRASES)
    meta = checkpoint_metadata("tiny", str(path))
    assert choose_voice("auto", meta) == ("flow", "auto: the flow head's measured phrase word error 0.080 <= 0.15")
    assert PhraseSet.from_metadata(meta) == PHRASES
    assert PhraseSet.from_metadata({"trainer": "train.cli"}) == PhraseSet(TRAINED_REPLIES, TRAINED_ANSWER_LEAD)
    assert PhraseSet.from_metadata({}) is None, "random weights decode freely"


def test_the_writer_keeps_the_model_within_its_phrases() -> None:
    w = PhraseWriter(PHRASES)
    space = torch.full((4, NO_BYTE + 1), -5.0)
    space[:, ord(" ")] = 5.0  # what the shipped checkpoint's text head prefers: spaces
    space[:, ord("N")] = 1.0
    written = b""
    for _ in range(5):
        written += bytes(b for b in w.write(space) if b != NO_BYTE)
    # A space after a whole phrase begins another (4 bytes a micro-turn: "l.", the space, "N"); the
    # utterance so far, to the end of the phrase now forced, is what the talker may speak.
    assert written == b"No problem at all. N" and not w.began_another
    assert w.committed() == "No problem at all. No problem at all."
    for _ in range(12):
        written += bytes(b for b in w.write(space) if b != NO_BYTE)
    assert written == b" ".join([b"No problem at all."] * MAX_CHAINED), "never more phrases than training chains"
    assert w.complete
    w.reset()
    ends = torch.full((4, NO_BYTE + 1), -5.0)
    ends[:, ord("S")], ends[:, NO_BYTE] = 1.0, 2.0  # 3 bytes a micro-turn (the least), then it stops
    said = b"".join(bytes(b for b in w.write(ends) if b != NO_BYTE) for _ in range(12))
    assert said == b"Sure, I can help with that." and w.chained == 0, "NO_BYTE over a space: it ends there"
    w.reset()
    assert w.committed() is None and w.write(space)[0] == ord("N"), "no answer heard yet: only the replies"
    assert w.began_another, "a second utterance: the transcript puts a space before it"
    w.reset()
    w.hear_background(ANSWER.encode()[:9])
    w.hear_background(ANSWER.encode()[9:] + b"\n")
    lead = torch.full((4, NO_BYTE + 1), -5.0)
    lead[:, ord("H")] = 5.0
    w.write(lead)
    assert w.committed() == f"{TRAINED_ANSWER_LEAD} {ANSWER}", "one path left: the answer it read, word-exact"


@pytest.fixture(scope="module")
def talker() -> Iterator[PiperTalker]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DUPLEX_TTS_DETERMINISTIC", "1")  # Piper without sampling noise: a phrase renders one way
        t = PiperTalker(PHRASES)
        t.prerendered.join()
        yield t
        t.shutdown()


def test_the_talker_speaks_each_chained_phrase_whole_as_it_is_settled(talker: PiperTalker) -> None:
    """The writer's `committed` grows phrase by phrase; the talker queues exactly what is new of it, and
    a stop drops the rest within the micro-turn."""
    ts = talker.open()
    first, second = PHRASES.replies[1], PHRASES.replies[0]
    talker.step(ts, speak=True, stop=False, backchannel=False, new=first[:4].encode(), committed=first)
    talker.step(ts, speak=True, stop=False, backchannel=False, new=b" Su", committed=None)  # not settled yet
    assert [p.text for p in ts.speaker.queue] == [first]
    talker.step(ts, speak=True, stop=False, backchannel=False, new=b"re,", committed=f"{first} {second}")
    talker.step(ts, speak=True, stop=False, backchannel=False, new=b" I c", committed=f"{first} {second}")
    assert [p.text for p in ts.speaker.queue] == [first, second], "the second phrase once, whole"
    assert not talker.step(ts, speak=False, stop=True, backchannel=False, new=b"", committed=None).any()
    assert not ts.speaker.queue
    talker.close(ts)


def force(net: InteractionTransformer, action: str, byte: str | None = None) -> None:
    """Bias the control head to `action` (and the text head to `byte`) between real steps."""
    with torch.no_grad():
        net.control_head.bias.zero_()  # type: ignore[union-attr]
        net.control_head.bias[ACTIONS.index(action)] = 20.0  # type: ignore[index]
        if byte is not None:
            net.text_head.bias[ord(byte)] += 20.0  # type: ignore[index]


def run(model: NativeModel, st: NativeSession, ticks: list[TickInput],
        seen: list[TickFeatures] | None = None) -> list[TickOutput]:
    """Step like the media-pace engine: wait for the talker's due synthesis, then step."""
    outs = []

    def observe(_: NativeSession, f: TickFeatures, __: HeadOutputs) -> None:
        if seen is not None:
            seen.append(f)

    for t in ticks:
        for job in model.pending_work(st):
            job.result(timeout=30)
        outs += model.step([(st, t)], observe=observe)
    return outs


def test_the_model_hears_the_audio_the_client_got_and_a_yield_cuts_it(talker: PiperTalker) -> None:
    net = small_net(seed=3)
    force(net, "speak")
    model = NativeModel(net, "native:test", 1, CPU, deterministic=True, phrases=PHRASES, talker=talker)
    st = model.open("s")
    seen: list[TickFeatures] = []
    outs = run(model, st, [TickInput(SILENCE, 4800)] * 4, seen)
    said = "".join(o.text for o in outs)
    assert said and any(said.startswith(p[: len(said)]) for p in PHRASES.replies), f"not a phrase: {said!r}"
    assert all(o.audio.any() for o in outs[1:]), "Piper plays from the micro-turn the phrase is committed"
    # 1. What the model hears as its own channel on micro-turn k+1 is the dMel of what the client got on k.
    front = DMelFrontend(net.cfg.dmel_bins, net.cfg.dmel_levels, CPU)
    tail = torch.zeros(CONTEXT)
    for k, out in enumerate(outs[:-1]):
        own = torch.cat([tail, torch.from_numpy(out.audio)])
        tail = own[-CONTEXT:]
        assert torch.equal(seen[k + 1].self_dmel[0], front(own[None], True)[0]), f"micro-turn {k + 1}"
    # 2. The model yields mid-phrase: this very micro-turn is silent, and nothing of the phrase follows.
    assert st.talk is not None and st.talk.speaker.queue and st.talk.speaker.queue[0].pos > 0, "mid-phrase"
    force(net, "yield")
    cut = run(model, st, [TickInput(SILENCE, 4800)] * 3)
    assert [e.type for e in cut[0].events] == ["yielded"]
    assert not any(o.audio.any() for o in cut), "a yield cuts Piper within the micro-turn"
    model.close(st)


def test_a_delegated_question_is_answered_in_the_models_timing(talker: PiperTalker) -> None:
    """The decision forced through real steps (the shipped checkpoint never delegates); the answer's
    words come from the background stream the model read, and are heard as words."""
    net = small_net(seed=4)
    model = NativeModel(net, "native:test", 1, CPU, deterministic=True, phrases=PHRASES, talker=talker)
    st = model.open("d")
    force(net, "delegate")
    asked = run(model, st, [TickInput(SILENCE, 4800, text=["when does the library open?"]),
                            TickInput(SILENCE, 4800)])
    events = [e for o in asked for e in o.events if e.type == "delegate"]
    assert [e.data["query"] for e in events] == ["when does the library open?"]
    chunk = BackgroundChunk("r1", 0, ANSWER, done=True)
    waited = run(model, st, [TickInput(SILENCE, 4800, background=[chunk])] + [TickInput(SILENCE, 4800)] * 3)
    assert not any(o.audio.any() for o in asked + waited), "it delegated: no words of its own yet"
    force(net, "speak", byte="H")
    outs = run(model, st, [TickInput(SILENCE, 4800)] * 20)
    said = f"{TRAINED_ANSWER_LEAD} {ANSWER}"
    assert "".join(o.text for o in outs) == said
    played = np.concatenate([o.audio for o in outs])
    start = int(np.flatnonzero(played)[0])
    assert start <= 3 * 4800, "spoken within its synthesis budget of the moment the model chose"
    whole = talker.synth.render(said)  # one Piper phrase, played whole and nothing else
    assert np.array_equal(played[start : start + len(whole)], whole) and not played[start + len(whole) :].any()
    model.close(st)
