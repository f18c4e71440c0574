"""train/average.py: the weighted average of native checkpoints, what it keeps, drops and refuses."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from models.interaction import save_checkpoint
from models.interaction.checkpoint import build, read_config, read_metadata, update_metadata
from models.interaction.phrases import TRAINED_ANSWER_LEAD, TRAINED_REPLIES, PhraseSet
from tests.models.test_interaction_core import small_cfg, small_net
from train.average import average, main

PHRASES = PhraseSet(("Sure.", "No problem."), "Here is what I found.")


def _write(path: Path, seed: int, step: str, phrases: PhraseSet = PHRASES, dim: int | None = None) -> Path:
    cfg = small_cfg() if dim is None else small_cfg(dim=dim)
    extra = {"command": f"duplex train --seed {seed}", "step": step, "commit": "abc", "onset_threshold": "0.6",
             "trainer": "train.cli"}
    save_checkpoint(small_net(cfg, seed=seed), path, "tiny", extra=extra, phrase_wer=0.9, phrases=phrases)
    return path


def test_the_average_is_the_weighted_sum_and_keeps_only_what_describes_it(tmp_path: Path) -> None:
    a, b = _write(tmp_path / "a.safetensors", 1, "100"), _write(tmp_path / "b.safetensors", 2, "100 + 50")
    out = tmp_path / "mix.safetensors"
    meta = average([a, b], [1, 3], out, "python -m train.average a b --weights 1 3")
    ta, tb, tm = load_file(str(a)), load_file(str(b)), load_file(str(out))
    assert tm.keys() == ta.keys()
    for k in tm:
        assert tm[k].dtype == ta[k].dtype
        torch.testing.assert_close(tm[k], 0.25 * ta[k] + 0.75 * tb[k])
    assert any(not torch.equal(tm[k], ta[k]) for k in tm), "the seeds differ, so must the average"
    assert read_metadata(out) == meta
    # Measured on the inputs' weights, so not true of the average: dropped, to be measured again.
    for key in ("phrase_word_error", "onset_threshold"):
        assert key not in meta
    assert meta["trainer"] == "train.average", "trained weights: --voice auto must not give them the flow head"
    assert PhraseSet.from_metadata(meta) == PHRASES and meta["preset"] == "tiny"
    parents = json.loads(meta["averaged_from"])
    assert [(p["file"], p["weight"], p["step"]) for p in parents] == [
        (str(a), 0.25, "100"), (str(b), 0.75, "100 + 50")]
    assert parents[0]["command"] == "duplex train --seed 1" and meta["command"].startswith("python -m train.average")
    build("tiny", str(out))  # a checkpoint the server loads like any other


def test_a_weight_of_one_reproduces_that_checkpoint(tmp_path: Path) -> None:
    a, b = _write(tmp_path / "a.safetensors", 1, "1"), _write(tmp_path / "b.safetensors", 2, "1")
    assert main([str(a), str(b), "--weights", "0", "1", "--out", str(tmp_path / "m.safetensors")]) == 0
    tb, tm = load_file(str(b)), load_file(str(tmp_path / "m.safetensors"))
    assert all(torch.equal(tm[k], tb[k]) for k in tb)


def test_the_trained_phrase_set_of_train_cli_checkpoints_is_written_out(tmp_path: Path) -> None:
    """A `duplex train` export without a phrase set decodes within the training bank (phrases.py); the
    average is no train.cli checkpoint, so it records that set itself, or it would write freely."""
    paths = []
    for seed in (1, 2):
        paths.append(tmp_path / f"{seed}.safetensors")
        save_checkpoint(small_net(seed=seed), paths[-1], "tiny", extra={"trainer": "train.cli"})
    meta = average(paths, [1, 1], tmp_path / "m.safetensors", "c")
    assert PhraseSet.from_metadata(meta) == PhraseSet(TRAINED_REPLIES, TRAINED_ANSWER_LEAD)


def test_checkpoints_that_cannot_be_averaged_are_refused_with_the_reason(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    a = _write(tmp_path / "a.safetensors", 1, "1")
    other = _write(tmp_path / "p.safetensors", 2, "1", phrases=PhraseSet(("Okay.",), "Here is what I found."))
    wide = _write(tmp_path / "w.safetensors", 3, "1", dim=small_cfg().dim * 2)
    out = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match="'phrases'"):
        average([a, other], [1, 1], out, "c")
    with pytest.raises(ValueError, match="'config'"):
        average([a, wide], [1, 1], out, "c")
    with pytest.raises(ValueError, match="one weight per checkpoint"):
        average([a, other], [1], out, "c")
    with pytest.raises(ValueError, match=">= 0"):
        average([a, other], [1, -1], out, "c")
    assert main([str(a), str(tmp_path / "missing.safetensors"), "--out", str(out)]) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    assert main([str(a), str(wide), "--out", str(out)]) == 2
    assert "only checkpoints of one architecture" in capsys.readouterr().err
    assert not out.exists(), "nothing is written when the inputs are refused"


def test_checkpoints_with_the_old_names_of_the_memory_sizes_load_and_average_with_new_ones(tmp_path: Path) -> None:
    """Checkpoints written before the micro-turn was a tick in the model's math (the shipped native-tiny among
    them) name window_ticks, sink_ticks and global_ticks `*_turns`: they load, and average with new ones."""
    old, new = _write(tmp_path / "old.safetensors", 1, "1"), _write(tmp_path / "new.safetensors", 2, "1")
    saved = read_metadata(old)["config"]
    assert '"window_ticks"' in saved and "_turns" not in saved, "new checkpoints are written with the new names"
    update_metadata(old, {"config": saved.replace("_ticks", "_turns")})
    assert '"sink_turns"' in read_metadata(old)["config"]
    assert read_config(old)[1].same_as(read_config(new)[1])
    build("tiny", str(old))
    meta = average([old, new], [1, 1], tmp_path / "mix.safetensors", "python -m train.average old new")
    assert meta["config"] == saved, "compared, and written, under today's names"
