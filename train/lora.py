"""LoRA (Hu et al. 2021) on every linear layer of the model, MLP and heads included, from outside.

The model's `Lin` is left as it is (it is the serving hot path): each one is swapped for a wrapper
that runs it frozen and adds a rank-r update, x -> Lin(x) + scale * (x A^T) B^T. `merge` folds the
updates back into plain `Lin` weights, so what is served is the ordinary model.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.interaction.layers import Lin


class LoRALin(nn.Module):
    def __init__(self, base: Lin, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        self.base = base
        d_out, d_in = base.weight.shape
        self.scale = alpha / rank
        # A random (Kaiming-uniform like the paper's code), B zero: training starts from the base model.
        bound = 1.0 / math.sqrt(d_in)
        self.lora_a = nn.Parameter((torch.rand(rank, d_in, generator=generator) * 2 - 1) * bound)
        self.lora_b = nn.Parameter(torch.zeros(d_out, rank))

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + F.linear(F.linear(x, self.lora_a.to(x.dtype)), self.lora_b.to(x.dtype)) * self.scale

    def merged(self) -> Lin:
        with torch.no_grad():
            self.base.weight.add_((self.lora_b @ self.lora_a * self.scale).to(self.base.weight.dtype))
        return self.base


def apply_lora(net: nn.Module, rank: int, alpha: float | None = None, seed: int = 0) -> list[nn.Parameter]:
    """Wrap every Lin in `net` (in place); freeze everything else. Returns the LoRA parameters."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    g = torch.Generator().manual_seed(seed)
    for p in net.parameters():
        p.requires_grad_(False)
    targets = [(name, m) for name, m in net.named_modules() if isinstance(m, Lin)]
    for name, m in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = net.get_submodule(parent_name) if parent_name else net
        setattr(parent, leaf, LoRALin(m, rank, float(alpha or 2 * rank), g))
    return [p for n, p in net.named_parameters() if "lora_" in n]


def merge_lora(net: nn.Module) -> int:
    """Fold every LoRALin back into its Lin (in place); returns how many were merged."""
    targets = [(name, m) for name, m in net.named_modules() if isinstance(m, LoRALin)]
    for name, m in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = net.get_submodule(parent_name) if parent_name else net
        setattr(parent, leaf, m.merged())
    for p in net.parameters():
        p.requires_grad_(True)
    return len(targets)
