"""Weights as safetensors, with the config in the file's metadata so a checkpoint describes itself."""

import dataclasses
import json
import logging
import shutil
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from models.interaction.config import InteractionConfig, preset
from models.interaction.model import InteractionTransformer, init_weights
from models.interaction.phrases import PhraseSet
from models.interaction.voice import PHRASE_WER_KEY

log = logging.getLogger(__name__)
FORMAT = "duplex-native-1"
INIT_SEED = 1234


def save_checkpoint(
    net: InteractionTransformer,
    path: str | Path,
    preset_name: str,
    dtype: torch.dtype | None = None,
    extra: dict[str, str] | None = None,
    phrase_wer: float | None = None,
    phrases: PhraseSet | None = None,
) -> None:
    """Weights (optionally cast, e.g. fp16 to halve the file) and the config; `extra` goes into the
    metadata too (the trainer records its command, data seed and commit there). `phrase_wer`: the flow
    head's measured word error on held-out phrases (`--voice auto` reads it: models/interaction/voice.py);
    `phrases`: what the model was trained to say (its text is decoded within it: phrases.py)."""
    tensors = {k: v.detach().to("cpu", dtype=dtype or v.dtype).contiguous() for k, v in net.state_dict().items()}
    meta = {**(extra or {}), "format": FORMAT, "preset": preset_name, "config": json.dumps(net.cfg.to_dict())}
    if phrase_wer is not None:
        meta[PHRASE_WER_KEY] = f"{phrase_wer:.4f}"
    if phrases is not None:
        meta.update(phrases.to_metadata())
    save_file(tensors, str(path), metadata=meta)


def checkpoint_metadata(preset_name: str, checkpoint: str | None) -> dict[str, str]:
    """The metadata of the checkpoint `build(preset_name, checkpoint)` loads ({} for random weights)."""
    if checkpoint == RANDOM:
        return {}
    path = checkpoint if checkpoint is not None else shipped_checkpoint(preset_name)
    return read_metadata(path) if path is not None and Path(path).is_file() else {}


def update_metadata(path: str | Path, entries: dict[str, str]) -> None:
    """Add or replace metadata entries of a checkpoint file in place; its tensors are written back
    unchanged (same names, dtypes and bytes). Written beside it first, then renamed over it."""
    path = Path(path)
    meta = read_metadata(path)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a duplex native checkpoint (metadata format {meta.get('format')!r})")
    tensors = load_file(str(path))
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={**meta, **entries})
    shutil.copymode(path, tmp)  # safetensors writes 0600; the checkpoint keeps its own mode
    tmp.replace(path)


def read_metadata(path: str | Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def read_config(path: str | Path) -> tuple[str, InteractionConfig]:
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"{path} is not a duplex native checkpoint (metadata format {meta.get('format')!r}, want {FORMAT!r}); "
            "save one with models.interaction.save_checkpoint"
        )
    return meta["preset"], InteractionConfig.from_dict(json.loads(meta["config"]))


WEIGHTS = Path(__file__).parent / "weights"  # shipped checkpoints: native-<preset>.safetensors
RANDOM = "random"  # --checkpoint random: seeded random weights even where a trained checkpoint ships


def shipped_checkpoint(preset_name: str) -> Path | None:
    path = WEIGHTS / f"native-{preset_name}.safetensors"
    return path if path.is_file() else None


def build(preset_name: str, checkpoint: str | None) -> InteractionTransformer:
    """The network for `native:<preset>`: from a checkpoint; without one, the shipped trained weights
    of that preset (models/interaction/weights/); without those (or with "random"), seeded random
    weights with a warning."""
    if checkpoint is None:
        shipped = shipped_checkpoint(preset_name)
        if shipped is not None:
            log.info("native:%s: loading the shipped checkpoint %s", preset_name, shipped)
            return build(preset_name, str(shipped))
    if checkpoint is None or checkpoint == RANDOM:
        net = InteractionTransformer(preset(preset_name))
        init_weights(net, INIT_SEED)
        msg = (
            f"native:{preset_name} has RANDOM weights (seed {INIT_SEED}, no trained checkpoint): it stays mostly "
            "silent and says nothing meaningful. Pass --checkpoint FILE.safetensors with trained weights."
        )
        warnings.warn(msg, stacklevel=2)
        log.warning(msg)
        return net
    if not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist; check the --checkpoint path")
    saved_preset, cfg = read_config(checkpoint)
    if saved_preset != preset_name:
        raise ValueError(
            f"checkpoint {checkpoint} holds a native:{saved_preset} model, not native:{preset_name}; "
            f"run with --model native:{saved_preset}"
        )
    net = InteractionTransformer(cfg)
    state = load_file(checkpoint)
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {checkpoint} does not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}; it was saved by a different version"
        )
    return net


def add_heard_channel(net: InteractionTransformer, tokens: int) -> InteractionTransformer:
    """`net` with the heard-words channel (heard.py) of `tokens` bytes a micro-turn, its embedding at
    zero: the new model does exactly what `net` did until training teaches it to read the words."""
    if net.cfg.heard_tokens == tokens:
        return net
    if net.cfg.heard_tokens:
        raise ValueError(f"the checkpoint already reads {net.cfg.heard_tokens} heard bytes a micro-turn, "
                         f"not {tokens}; train a new one from it without --heard-tokens")
    new = InteractionTransformer(dataclasses.replace(net.cfg, heard_tokens=tokens))
    missing, unexpected = new.load_state_dict(net.state_dict(), strict=False)
    assert missing == ["heard.weight"] and not unexpected, (missing, unexpected)
    assert new.heard is not None
    with torch.no_grad():
        new.heard.weight.zero_()
    return new.to(next(net.parameters()).device)


def parameter_count(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())
