"""Video input: the newest frame cut into 40x40 patches, each encoded by an hMLP stem.

hMLP (Touvron et al., "Three things everyone should know about ViTs", 2022): convolutions whose
stride equals their kernel (4x4, then 2x2, then 5x5 = 40 pixels), with a norm and GELU between, so
each patch is encoded on its own and nothing mixes patches before the transformer. A stride=kernel
convolution is a linear map on non-overlapping blocks, which is how it is written here (reshape +
Lin): that keeps it on the same deterministic tile-wise matmul as the rest of the model.
"""

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.interaction.config import InteractionConfig
from models.interaction.layers import Lin

PATCH = 40


def frame_patches(frame: npt.NDArray[np.uint8], grid: int, device: torch.device) -> Tensor:
    """[H, W, 3] uint8 -> [grid*grid, 40, 40, 3] float, normalised to about [-2, 2].

    The frame is resized (aspect ratio not kept) to grid*40 pixels square; one frame per micro-turn.
    """
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"video frames must be [H, W, 3] uint8 RGB, got shape {frame.shape}")
    img = torch.from_numpy(np.ascontiguousarray(frame)).to(device).permute(2, 0, 1)[None].float()  # [1, 3, H, W]
    side = grid * PATCH
    img = F.interpolate(img, size=(side, side), mode="bilinear", antialias=True, align_corners=False)
    img = (img / 255.0 - 0.5) / 0.25
    # [1, 3, g, 40, g, 40] -> [g, g, 40, 40, 3] -> [g*g, 40, 40, 3]
    return img.reshape(3, grid, PATCH, grid, PATCH).permute(1, 3, 2, 4, 0).reshape(grid * grid, PATCH, PATCH, 3)


def _blocks(x: Tensor, k: int) -> Tensor:
    """[B, P, S, S, C] -> [B, P, S/k, S/k, k*k*C]: non-overlapping k x k blocks, flattened."""
    b, p, s, _, c = x.shape
    x = x.reshape(b, p, s // k, k, s // k, k, c).permute(0, 1, 2, 4, 3, 5, 6)
    return x.reshape(b, p, s // k, s // k, k * k * c)


class HMLP(nn.Module):
    def __init__(self, cfg: InteractionConfig) -> None:
        super().__init__()
        c1, c2 = cfg.hmlp_channels
        self.stage1 = Lin(4 * 4 * 3, c1, bias=True)  # 40 -> 10
        self.norm1 = nn.LayerNorm(c1)
        self.stage2 = Lin(2 * 2 * c1, c2, bias=True)  # 10 -> 5
        self.norm2 = nn.LayerNorm(c2)
        self.stage3 = Lin(5 * 5 * c2, cfg.dim, bias=True)  # 5 -> 1

    def forward(self, patches: Tensor) -> Tensor:
        """patches [B, P, 40, 40, 3] -> [B, P, dim]."""
        x = F.gelu(self.norm1(self.stage1(_blocks(patches, 4))))  # [B, P, 10, 10, c1]
        x = F.gelu(self.norm2(self.stage2(_blocks(x, 2))))  # [B, P, 5, 5, c2]
        b, p = x.shape[:2]
        return self.stage3(x.reshape(b, p, -1))  # [B, P, dim]
