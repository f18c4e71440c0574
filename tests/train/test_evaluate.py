"""train.evaluate's confusion matrix on the shipped checkpoint, and the phrase word error an export records."""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from models.interaction.checkpoint import build, read_metadata
from models.interaction.config import ACTIONS, NO_BYTE, preset
from models.interaction.phrases import PhraseSet, PhraseWriter
from models.interaction.voice import PHRASE_WER_KEY, choose_voice
from train import cli
from train.data import EpisodeData
from train.evaluate import _said, confusion_table, evaluate
from train.features import build_cache

TICKS = 20  # 4 s of one held-out-style episode: enough for a few control classes, fast on the real model
# Its first 4 s hold speak, silent and yield (a barge-in; seeds draw the episode's scenes and voices, so
# a change to how they are drawn moves it: 108 until a third of the users spoke in Piper's voice). Not a
# data seed the shipped checkpoint trained on (1, 5, 11, 15, 21, 25, 41, 45, 47, 48, 51, 52) nor a
# held-out one (2, 49).
SEED = 122


@pytest.fixture(scope="module")
def heldout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    old = os.environ.get("DUPLEX_TTS_DETERMINISTIC")
    os.environ["DUPLEX_TTS_DETERMINISTIC"] = "1"
    # One torch thread: these products are small, and on a busy 2-core machine two threads took 4x longer.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("heldout")
    build_cache(path, preset("tiny"), SEED, episodes=1, ticks=TICKS, shard=1, keep_audio=True, log=lambda m: None)
    yield path
    torch.set_num_threads(threads)
    if old is None:
        os.environ.pop("DUPLEX_TTS_DETERMINISTIC", None)
    else:
        os.environ["DUPLEX_TTS_DETERMINISTIC"] = old


def test_confusion_matrix_bookkeeping_on_the_shipped_model(heldout: Path) -> None:
    """Rows count the episode's labels, columns the model's teacher-forced argmax, the diagonal is the
    accuracy's numerator: checked against a forward pass of the same real checkpoint done here."""
    net = build("tiny", None)
    data = EpisodeData(heldout, net.cfg)
    r = evaluate(net, data, 1, voice=False)
    counts = np.array(r["confusion"]["counts"])
    assert r["confusion"]["rows_label_cols_predicted"] == list(ACTIONS)
    assert counts.shape == (len(ACTIONS), len(ACTIONS))
    assert counts.sum() == r["micro_turns"] == TICKS

    b = data.batch([0])
    with torch.no_grad():
        pred = net.forward_batched(b.feats, b.n_ticks).control[:, : len(ACTIONS)].argmax(-1).numpy()
    label = b.control.numpy()
    assert np.array_equal(counts.sum(1), np.bincount(label, minlength=len(ACTIONS)))
    assert np.array_equal(counts.sum(0), np.bincount(pred, minlength=len(ACTIONS)))
    assert np.trace(counts) == r["control_correct"] == int(np.sum(pred == label))
    assert r["control_accuracy"] == round(r["control_correct"] / TICKS, 4)
    assert len(set(label.tolist())) >= 3, "the episode should hold speak, silent and yield"
    # The barge-in's first micro-turn is labelled speak under the user's speech, and yielded to next: it is
    # no backchannel to talk through, so there is nothing of that kind to count here.
    y = int(np.flatnonzero(label == ACTIONS.index("yield"))[0])
    assert label[y - 1] == ACTIONS.index("speak") and b.user_speaking[y - 1] > 0.5
    assert "overlaps_talked_through" not in r, r
    for i, a in enumerate(ACTIONS):
        if counts[i].sum():
            assert r["recall"][a] == round(counts[i, i] / counts[i].sum(), 3)
        if counts[:, i].sum():
            assert r["precision"][a] == round(counts[i, i] / counts[:, i].sum(), 3)

    table = confusion_table(r).splitlines()
    assert table[0].split()[-2:] == ["total", "recall"] and all(a in table[0] for a in ACTIONS)
    speak_row = table[1 + ACTIONS.index("speak")].split()
    assert speak_row[0] == "speak" and [int(x) for x in speak_row[1:-1]] == [
        *counts[ACTIONS.index("speak")].tolist(), int(counts[ACTIONS.index("speak")].sum())]
    assert f"({r['control_correct']}/{TICKS} micro-turns" in table[-1]


def test_duplex_train_export_records_the_phrase_wer_auto_reads(heldout: Path, tmp_path: Path) -> None:
    """--phrase-wer reaches the exported checkpoint's metadata (TrainingClient.export -> save_checkpoint),
    and --voice auto gives the flow head the voice on it (without the field a trained export gets Piper)."""
    out = tmp_path / "run"
    assert cli.main(["--data", str(heldout), "--heldout", str(heldout), "--minutes", "0", "--batch", "1",
                     "--eval-every", "0", "--out", str(out), "--phrase-wer", "0.1"]) == 0
    meta = read_metadata(out / "native-tiny.safetensors")
    assert meta[PHRASE_WER_KEY] == "0.1000"
    assert meta["trainer"] == "train.cli" and json.loads(meta["config"])["dim"] == preset("tiny").dim
    assert choose_voice("auto", meta)[0] == "flow"
    del meta[PHRASE_WER_KEY]
    assert choose_voice("auto", meta)[0] == "piper"


def test_a_reply_is_read_as_it_is_served_on_while_the_model_keeps_speaking() -> None:
    """A model that chains replies ("Hi. Hi. Hi.", a space scored above "nothing more") writes a second
    phrase inside a label one phrase long: read over the label's micro-turn alone it is a phrase begun and
    not finished; read on while the model speaks, as the talker serves it, three whole phrases."""
    phrases = PhraseSet(("Hi.", "Ok."), "Here is what I found.")
    background = torch.full((6, 8), NO_BYTE)
    chains = torch.zeros(6, 4, 257)
    chains[:, :, ord(" ")] = 1.0
    label_only = PhraseWriter(phrases)
    assert _said(label_only, chains, background, 0, 1) == b"" and label_only.committed() is None
    served = PhraseWriter(phrases)
    speaking = np.array([True, True, True, False, False, False])
    assert _said(served, chains, background, 0, 1, speaking) == b"Hi. Hi. Hi."
    assert served.committed() == "Hi. Hi. Hi."
    single = PhraseWriter(phrases)  # no chaining: the first whole phrase, as before
    assert _said(single, torch.zeros(6, 4, 257), background, 0, 1) == b"Hi."
