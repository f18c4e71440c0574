"""A Moshi-family checkpoint on disk, found and checked before anything is built, then loaded offline.

`--checkpoint` names either a folder in kyutai's released layout, or a Hugging Face repo id
(`kyutai/moshiko-pytorch-bf16`, or `hf://kyutai/...`) already in the local Hugging Face cache: the
cache is read with `local_files_only=True`, so nothing is ever downloaded at start-up.

The folder holds `config.json` (the LM's kwargs, plus the names of the other files: `moshi_name`,
`mimi_name`, `tokenizer_name`, optionally `mimi_config_name` and `lora_name`), the LM and Mimi
safetensors and the sentencepiece text tokenizer. A folder without `config.json` is read as the
original Moshi 7B release (moshi's default file names and configuration), as moshi itself does.
Every way a checkpoint can be wrong raises `CheckpointError` naming the file and what to do.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.moshi.runtime import import_moshi

log = logging.getLogger(__name__)
_REPO_ID = re.compile(r"^(hf://)?[A-Za-z0-9][\w.-]*/[\w.-]+$")
USAGE = ("--checkpoint takes a folder holding config.json, the LM and Mimi safetensors and the text tokenizer "
         "(kyutai's released layout; `python -m models.moshi.tiny --out DIR` writes a tiny one), or the id of a "
         "Hugging Face repo already in the local cache (e.g. kyutai/moshiko-pytorch-bf16)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be served; the message says which file and what to do."""


@dataclass(frozen=True)
class MoshiFiles:
    """Where each part of a checkpoint is, every path checked to exist."""

    folder: Path
    config: Path | None  # None: the original 7B release, without config.json
    lm: Path
    mimi: Path
    tokenizer: Path
    mimi_config: Path | None  # None: moshi's built-in Mimi configuration
    lora: Path | None


@dataclass
class Loaded:
    lm: Any  # moshi.models.lm.LMModel, eval mode, on the device
    mimi: Any  # moshi.models.compression.MimiModel
    tokenizer: Any  # sentencepiece.SentencePieceProcessor
    lm_gen_config: dict[str, Any]  # the checkpoint's own sampling defaults (may be empty)
    label: str  # what to call it in logs
    model_type: str  # "moshi" or "hibiki"

    def conditions(self, n_slots: int) -> Any:
        """What a conditioned LM (Hibiki) is told, one row per slot; None for an unconditioned one.

        Hibiki sums a looked-up quality description into every step; moshi's own inference asks it for
        "very_good" and, with classifier-free guidance, contrasts "very_bad". Guidance doubles the batch
        and is not served here (cfg_coef 1): every slot gets "very_good"."""
        provider = self.lm.condition_provider
        if provider is None or not provider.conditioners:
            return None
        attributes = import_moshi().conditioners.ConditionAttributes
        return provider.prepare_and_provide(
            [attributes(text={"description": "very_good"}, tensor={}) for _ in range(n_slots)])


def resolve(checkpoint: str | None) -> Path:
    """The folder a `--checkpoint` value stands for."""
    if not checkpoint:
        raise CheckpointError(f"--model moshi needs a checkpoint: {USAGE}")
    path = Path(checkpoint).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {checkpoint!r} is a file, not a folder: {USAGE}")
        return path
    if _REPO_ID.match(checkpoint):
        return _from_hf_cache(checkpoint.removeprefix("hf://"))
    raise CheckpointError(f"checkpoint {checkpoint!r}: no such folder. {USAGE}")


def _from_hf_cache(repo: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except Exception as e:  # LocalEntryNotFoundError and kin: the repo is not in the cache
        from huggingface_hub import constants

        raise CheckpointError(
            f"checkpoint {repo!r} is neither a folder nor in the local Hugging Face cache ({constants.HF_HUB_CACHE}): "
            f"{type(e).__name__}. Nothing is downloaded at start-up: fetch it once where there is network "
            f"(`huggingface-cli download {repo}`, then copy the cache) or pass the folder itself") from None


def find_files(folder: Path) -> MoshiFiles:
    """Read config.json (if any) and check that every file it names is there."""
    loaders = import_moshi().models.loaders
    config_path: Path | None = folder / "config.json"
    raw: dict[str, Any] = {}
    assert config_path is not None
    if config_path.is_file():
        try:
            raw = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{config_path}: not readable JSON ({e}); restore it from the release") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"{config_path}: expected a JSON object of LM settings, got {type(raw).__name__}")
    else:
        config_path = None
        log.warning("%s has no config.json: reading it as the original Moshi 7B release", folder)

    def need(key: str, default: str | None) -> Path | None:
        name = raw.get(key, default)
        if name is None:
            return None
        path = folder / str(name)
        if not path.is_file():
            told = f"config.json's {key}" if key in raw else "moshi's default name"
            raise CheckpointError(f"checkpoint {folder}: {path.name} ({told}) is missing; copy the whole release "
                                  f"folder, or fix {key} in config.json")
        return path

    lm, mimi, tok = need("moshi_name", loaders.MOSHI_NAME), need("mimi_name", loaders.MIMI_NAME), \
        need("tokenizer_name", loaders.TEXT_TOKENIZER_NAME)
    assert lm is not None and mimi is not None and tok is not None
    return MoshiFiles(folder, config_path, lm, mimi, tok, need("mimi_config_name", None), need("lora_name", None))


def _checkpoint_info(files: MoshiFiles) -> Any:
    loaders = import_moshi().models.loaders
    if files.config is None:
        return loaders.CheckpointInfo(files.lm, files.mimi, files.tokenizer)
    # Every path is given, so moshi's hf_get returns them as they are and never asks the Hub.
    return loaders.CheckpointInfo.from_hf_repo(
        str(files.folder), moshi_weights=files.lm, mimi_weights=files.mimi, tokenizer=files.tokenizer,
        config_path=files.config, mimi_config_path=files.mimi_config, lora_weights=files.lora)


def _short(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return "; ".join(lines[:3])[:400]


def load(checkpoint: str | None, device: torch.device, dtype: torch.dtype) -> Loaded:
    """Find, check and load the LM, Mimi and the tokenizer of `checkpoint` (offline)."""
    files = find_files(resolve(checkpoint))
    try:
        info = _checkpoint_info(files)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{files.config}: not a Moshi config ({_short(e)})") from None
    if info.model_type not in ("moshi", "hibiki"):
        raise CheckpointError(f"{files.config}: model_type {info.model_type!r} is not a full-duplex speech model "
                              "(moshi or hibiki); TTS and STT checkpoints are not served by --model moshi")
    try:
        mimi = info.get_mimi(device=device)
    except Exception as e:
        raise CheckpointError(f"{files.mimi}: Mimi weights do not load ({type(e).__name__}: {_short(e)}); they must "
                              "be the release's Mimi safetensors, matching mimi_config_name if config.json has one"
                              ) from None
    try:
        lm = info.get_moshi(device=device, dtype=dtype)
    except Exception as e:
        raise CheckpointError(f"{files.lm}: LM weights do not load ({type(e).__name__}: {_short(e)}); the weights "
                              "and config.json must come from the same release") from None
    try:
        tokenizer = info.get_text_tokenizer()
    except Exception as e:
        raise CheckpointError(f"{files.tokenizer}: not a sentencepiece model ({_short(e)})") from None
    _check_fit(files, lm, mimi, tokenizer)
    conditioned = lm.condition_provider is not None and bool(lm.condition_provider.conditioners)
    if conditioned and (info.model_type != "hibiki" or set(lm.condition_provider.conditioners) != {"description"}):
        raise CheckpointError(f"{files.config}: an LM conditioned on {sorted(lm.condition_provider.conditioners)} "
                              f"({info.model_type}); only Hibiki's description conditioning is served")
    return Loaded(lm, mimi, tokenizer, dict(info.lm_gen_config), files.folder.name or str(files.folder),
                  info.model_type)


def _check_fit(files: MoshiFiles, lm: Any, mimi: Any, tokenizer: Any) -> None:
    """The three parts must agree with each other, or the first step would fail (or babble ids)."""
    if mimi.sample_rate != 24_000 or mimi.channels != 1:
        raise CheckpointError(f"{files.mimi}: Mimi at {mimi.sample_rate} Hz x {mimi.channels} channel(s); this server "
                              "runs 24 kHz mono inside (every released Moshi and Hibiki Mimi is)")
    if mimi.cardinality != lm.card:
        raise CheckpointError(f"{files.mimi}: Mimi codebooks of {mimi.cardinality} entries, but the LM "
                              f"({files.lm}) reads codes < {lm.card}; use the Mimi of the same release")
    user_codebooks = lm.n_q - lm.dep_q
    if mimi.num_codebooks < max(lm.dep_q, user_codebooks):
        raise CheckpointError(f"{files.mimi}: Mimi gives {mimi.num_codebooks} codebooks; the LM needs "
                              f"{max(lm.dep_q, user_codebooks)}")
    if tokenizer.vocab_size() < lm.text_card:
        raise CheckpointError(f"{files.tokenizer}: {tokenizer.vocab_size()} pieces, but the LM writes text ids up "
                              f"to {lm.text_card - 1}; use the tokenizer of the same release")
