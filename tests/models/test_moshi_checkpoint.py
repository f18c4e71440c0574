"""`--model moshi --checkpoint ...`: the released layout and a Hugging Face cache entry load offline;
every broken checkpoint stops start-up with a message naming the file and what to do; the full 7B
configuration's shapes step (slow: on the meta device)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

# Not importorskip: models.moshi imports moshi itself, with torch.compile off on a CPU.
if importlib.util.find_spec("moshi") is None:
    pytest.skip("the optional moshi package is not installed: make setup-moshi", allow_module_level=True)

from safetensors.torch import load_file, save_file

from models.moshi import slot_bytes, tiny
from models.moshi.checkpoint import CheckpointError, resolve
from models.moshi.options import parse_options
from models.moshi.serving import MoshiModel
from models.registry import load_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return tiny.write(tmp_path_factory.mktemp("tiny-moshi"))


def broken(tiny_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny checkpoint to break."""
    return Path(shutil.copytree(tiny_dir, tmp_path / "ckpt"))


def test_released_layout_loads_offline(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = load_model("moshi:slots=2,threads=1,greedy=true", checkpoint=str(tiny_dir))
    assert isinstance(model, MoshiModel) and model.max_sessions == 2 and model.sampling.greedy
    weights = load_file(str(tiny_dir / tiny.LM_NAME))
    assert torch.equal(model.lm.state_dict()["text_linear.weight"], weights["text_linear.weight"])
    assert model.lm.text_card == tiny.TEXT_VOCAB and model.frame == 1920 and model.lead == 960
    assert model.session_bytes > 0


def test_checkpoint_option_and_budget(tiny_dir: Path) -> None:
    model = load_model(f"moshi:checkpoint={tiny_dir},threads=1,budget_mb=1")
    assert isinstance(model, MoshiModel)
    assert model.n_slots == min(2**20 // model.session_bytes, 8), "slots from the budget, at most 8 on a CPU"
    with pytest.raises(ValueError, match="fewer than the 64 asked for"):
        load_model(f"moshi:checkpoint={tiny_dir},slots=64,budget_mb=1")
    with pytest.raises(ValueError, match="moshi option 'speed=2'"):
        parse_options("speed=2")
    with pytest.raises(ValueError, match="expected bool"):
        parse_options("greedy=maybe")


def test_hugging_face_cache_entry_is_read_offline(tiny_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--duplex-test--tiny-moshi"
    revision = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve("duplex-test/tiny-moshi") == repo / "snapshots" / revision
    assert resolve("hf://duplex-test/tiny-moshi") == repo / "snapshots" / revision
    with pytest.raises(CheckpointError, match="neither a folder nor in the local Hugging Face cache"):
        resolve("duplex-test/not-there")


def test_not_a_folder_or_nothing_named(tiny_dir: Path) -> None:
    with pytest.raises(CheckpointError, match="needs a checkpoint"):
        load_model("moshi")
    with pytest.raises(CheckpointError, match="is a file, not a folder"):
        load_model("moshi", checkpoint=str(tiny_dir / tiny.LM_NAME))
    with pytest.raises(CheckpointError, match="no such folder"):
        load_model("moshi", checkpoint=str(tiny_dir / "nope"))


@pytest.mark.parametrize("name, why", [
    (tiny.LM_NAME, "model.safetensors \\(config.json's moshi_name\\) is missing"),
    (tiny.MIMI_NAME, "checkpoint125.safetensors \\(config.json's mimi_name\\) is missing"),
    (tiny.TOKENIZER_NAME, "tokenizer_spm_32k_3.model \\(config.json's tokenizer_name\\) is missing"),
])
def test_missing_file_is_named(tiny_dir: Path, tmp_path: Path, name: str, why: str) -> None:
    ckpt = broken(tiny_dir, tmp_path)
    (ckpt / name).unlink()
    with pytest.raises(CheckpointError, match=why):
        load_model("moshi", checkpoint=str(ckpt))


def test_wrong_shapes_and_parts_that_do_not_fit(tiny_dir: Path, tmp_path: Path) -> None:
    ckpt = broken(tiny_dir, tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "dim": 96}))
    with pytest.raises(CheckpointError, match=r"LM weights do not load .*size mismatch.*same release"):
        load_model("moshi", checkpoint=str(ckpt))
    (ckpt / "config.json").write_text(json.dumps({**config, "text_card": 200}))  # more ids than the tokenizer has
    weights = load_file(str(tiny_dir / tiny.LM_NAME))
    weights["text_emb.weight"] = torch.zeros(201, config["dim"])
    weights["text_linear.weight"] = torch.zeros(200, config["dim"])
    weights["depformer_text_emb.weight"] = torch.zeros(201, config["depformer_dim"])
    save_file(weights, str(ckpt / tiny.LM_NAME))
    with pytest.raises(CheckpointError, match="96 pieces, but the LM writes text ids up to 199"):
        load_model("moshi", checkpoint=str(ckpt))
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: not readable JSON"):
        load_model("moshi", checkpoint=str(ckpt))
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / tiny.MIMI_NAME).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="Mimi weights do not load"):
        load_model("moshi", checkpoint=str(ckpt))


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("DUPLEX_SLOW_TESTS"), reason="~40 s on 2 shared cores: set DUPLEX_SLOW_TESTS=1")
def test_full_7b_configuration_steps_on_meta() -> None:
    """moshi's own 7B LM and Mimi configuration (random weights, on the meta device: shapes only, no
    memory) through `SlotLMGen` for a few frames with a slot masked out; and what one slot costs."""
    from models.moshi.lmgen import SlotLMGen
    from models.moshi.runtime import import_moshi
    from models.moshi.sampling import Sampling

    loaders = import_moshi().models.loaders
    meta = torch.device("meta")
    lm = loaders.get_moshi_lm(None, device=meta, dtype=torch.bfloat16)
    mimi = loaders.get_mimi(None, device=meta)
    assert 7.0e9 < sum(p.numel() for p in lm.parameters()) < 8.0e9
    per_slot = slot_bytes(lm, mimi)
    # The LM's KV ring: 32 layers x (K, V) x 3000 positions x 4096 x bf16 = 1.5 GiB, plus Mimi's and the rest.
    assert 32 * 2 * 3000 * 4096 * 2 <= per_slot < 1.1 * 32 * 2 * 3000 * 4096 * 2
    gen = SlotLMGen(lm, Sampling(greedy=True), 2)
    with torch.no_grad(), gen.streaming(2), mimi.streaming(2):
        for f in range(3):
            mask = torch.tensor([True, f != 1], device=meta)
            mimi.set_exec_mask(mask)
            codes = mimi.encode(torch.zeros(2, 1, 1920, device=meta))
            assert codes.shape == (2, 8, 1)
            gen.set_exec_mask(mask)
            out = gen.step(codes)
            assert out is not None and out.shape == (2, 1 + lm.dep_q, 1)
            assert mimi.decode(out[:, 1:].clamp(min=0)).shape == (2, 1, 1920)
