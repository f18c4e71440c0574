"""The re-prefill baseline (bench/engine_scaling.py): what a server without persistent sessions pays per
micro-turn, measured on the native model from outside it (the production class has no such path)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from models.base import TickInput, TickOutput

if TYPE_CHECKING:
    from models.interaction.model import TickFeatures
    from models.interaction.serving import NativeModel
    from models.interaction.session import NativeSession


def reprefills(model: object) -> bool:
    """Whether `model` has a re-prefill baseline: the native model only (looked up among the loaded modules,
    so that a run of another model never imports torch for the question)."""
    serving = sys.modules.get("models.interaction.serving")
    return serving is not None and isinstance(model, serving.NativeModel)


def silent_features(model: NativeModel, n: int) -> TickFeatures:
    """n micro-turns of silence and no input: a stand-in history for the re-prefill baseline."""
    import torch

    from models.interaction.config import FRAMES_PER_TICK, NO_BYTE
    from models.interaction.model import TickFeatures
    from models.interaction.video import PATCH

    cfg, dev = model.cfg, model.device
    zeros = torch.zeros(n, FRAMES_PER_TICK, cfg.dmel_bins, dtype=torch.long, device=dev)
    nb = torch.full((n, 1), NO_BYTE, dtype=torch.long, device=dev)
    return TickFeatures(
        user_dmel=zeros,
        self_dmel=zeros.clone(),
        video=torch.zeros(n, cfg.video_grid**2, PATCH, PATCH, 3, device=dev),
        video_present=torch.zeros(n, dtype=torch.bool, device=dev),
        typed=nb.expand(n, cfg.typed_tokens),
        background=nb.expand(n, cfg.background_tokens),
        own_text=nb.expand(n, cfg.text_tokens),
        heard=nb.expand(n, cfg.heard_tokens) if cfg.heard_tokens else None,
    )


def baseline_step(model: NativeModel, batch: Sequence[tuple[NativeSession, TickInput]]) -> list[TickOutput]:
    """What a server without persistent sessions pays per micro-turn.

    Each session's whole history (tick + 1 micro-turns, silence standing in for the real inputs: the cost
    does not depend on them) is re-run through `forward_sequence`, then the last micro-turn's audio is
    synthesised. Session state is not advanced.
    """
    import torch

    outs = []
    with torch.inference_mode():
        for st, _ in batch:
            heads = model.net.forward_sequence(silent_features(model, st.tick + 1))
            audio, _, _ = model._synthesize(heads.audio_cond[-1:], [st])
            outs.append(TickOutput(audio[0].float().cpu().numpy()))
    return outs
