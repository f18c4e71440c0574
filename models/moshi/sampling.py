"""Token choice per slot: each session draws from its own generator, so its output does not depend on
who shares its batch.

moshi's `sample_token` (moshi/utils/sampling.py) takes top-k of softmax(logits / temp) and picks
argmax(p / q) with q ~ Exp(1) drawn by `torch.empty_like(...).exponential_()` from torch's global
generator for the whole batch at once: a session's draws then depend on its row and on every other
row's. Here the same arithmetic runs batched, but each row's exponentials come from that session's
`torch.Generator`, drawn only when the row really steps. A session alone therefore draws exactly what
moshi's `LMGen` draws at batch 1 after `torch.manual_seed(seed)` (tests/models/test_moshi.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen (moshi's `LMGen` defaults; a checkpoint's `lm_gen_config` may change them)."""

    greedy: bool = False  # argmax everywhere: no generator is used
    temp: float = 0.8  # audio tokens
    temp_text: float = 0.7
    top_k: int = 250
    top_k_text: int = 25

    def __post_init__(self) -> None:
        if self.temp < 0 or self.temp_text < 0 or self.top_k < 0 or self.top_k_text < 0:
            raise ValueError(f"moshi sampling: temperatures and top-k must be >= 0, got {self}")


def choose(logits: Tensor, active: Tensor, generators: list[torch.Generator | None], temp: float,
           top_k: int) -> Tensor:
    """One token per row.

    logits [B, card] (any float dtype); active [B] bool: rows that step this frame (the others get
    argmax and draw nothing); generators[b]: row b's session's generator (None: a free slot).
    Returns [B] long. With temp == 0 every row is greedy, as in moshi.
    """
    logits = logits.float()
    if temp <= 0.0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temp, dim=-1)  # [B, card]
    indices: Tensor | None = None
    if top_k > 0:
        probs, indices = torch.topk(probs, min(top_k, probs.shape[-1]), dim=-1)  # [B, k]
    # q ~ Exp(1) per row from the row's own generator; ones for rows that do not step (argmax of p).
    q = torch.ones_like(probs)
    for b in active.nonzero().flatten().tolist():
        g = generators[b]
        if g is None:
            raise RuntimeError(f"slot {b} steps but holds no session generator (a slot reset was missed)")
        q[b].exponential_(1, generator=g)
    pick = (probs / q).argmax(-1, keepdim=True)  # [B, 1]
    return (indices.gather(-1, pick) if indices is not None else pick)[:, 0]
