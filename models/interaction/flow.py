"""Audio out: a rectified-flow head that turns the audio-out slots' hidden states into mel frames.

Rectified flow (Liu et al. 2022): x_t = (1 - t) * noise + t * mel, the network predicts the velocity
mel - noise, and sampling is a few Euler steps from noise (t = 0) to mel (t = 1). Each audio-out slot
generates FRAMES_PER_TICK / audio_out_tokens frames conditioned on its own hidden state.

The noise for micro-turn n of a session comes from a generator seeded with (session seed, n): a
session replays bit for bit, and its audio cannot depend on the batch it was stepped in.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.interaction.config import FRAMES_PER_TICK, InteractionConfig
from models.interaction.layers import Lin

TIME_DIM = 64
_MASK63 = (1 << 63) - 1


def noise_seed(seed: int, tick: int) -> int:
    """Mix a session seed and a micro-turn index into one generator seed (splitmix-style constants)."""
    return (seed * 0x9E3779B97F4A7C15 + tick * 0xBF58476D1CE4E5B9 + 1) & _MASK63


def tick_noise(seeds: list[int], ticks: list[int], shape: tuple[int, ...], device: torch.device) -> Tensor:
    """[B, *shape] standard normal noise, row b drawn from noise_seed(seeds[b], ticks[b]) on the CPU.

    Drawn on the CPU so that CPU and GPU runs of the same session get the same noise.
    """
    rows = []
    for s, n in zip(seeds, ticks, strict=True):
        g = torch.Generator().manual_seed(noise_seed(s, n))
        rows.append(torch.randn(shape, generator=g))
    return torch.stack(rows).to(device)


def time_embedding(t: float, device: torch.device) -> Tensor:  # -> [TIME_DIM]
    freqs = torch.exp(-math.log(1000.0) * torch.arange(TIME_DIM // 2, device=device) / (TIME_DIM // 2))
    ang = t * 1000.0 * freqs
    return torch.cat([torch.sin(ang), torch.cos(ang)])


class FlowHead(nn.Module):
    def __init__(self, cfg: InteractionConfig) -> None:
        super().__init__()
        self.steps = cfg.flow_steps
        self.frames = FRAMES_PER_TICK // cfg.audio_out_tokens
        self.mels = cfg.mel_bins
        width = self.frames * cfg.mel_bins
        self.cond = Lin(cfg.dim, cfg.flow_hidden, bias=True)
        self.inp = Lin(width, cfg.flow_hidden)
        self.time = Lin(TIME_DIM, cfg.flow_hidden)
        self.mid = Lin(cfg.flow_hidden, cfg.flow_hidden, bias=True)
        self.out = Lin(cfg.flow_hidden, width, bias=True)

    @property
    def width(self) -> int:
        return self.frames * self.mels

    def velocity(self, x: Tensor, t: float, cond_h: Tensor) -> Tensor:
        """x [B, M, width] at time t, cond_h [B, M, hidden] (projected condition) -> velocity [B, M, width]."""
        temb = self.time(time_embedding(t, x.device).to(x.dtype)[None, None])  # [1, 1, hidden]
        h = F.silu(self.inp(x) + cond_h + temb)
        return self.out(F.silu(self.mid(h)))

    def sample(self, cond: Tensor, noise: Tensor) -> Tensor:
        """cond [B, M, dim], noise [B, M, width] -> normalised log-mel [B, 20, mels] after Euler steps."""
        cond_h = self.cond(cond)
        x, dt = noise.to(cond.dtype), 1.0 / self.steps
        for i in range(self.steps):
            x = x + dt * self.velocity(x, i * dt, cond_h)
        b = x.shape[0]
        return x.reshape(b, FRAMES_PER_TICK, self.mels)

    def loss(self, cond: Tensor, mel: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Training objective: cond [B, M, dim], target normalised log-mel [B, 20, mels] -> scalar MSE."""
        b, m = cond.shape[:2]
        x1 = mel.reshape(b, m, self.width)
        x0 = torch.randn(x1.shape, generator=generator, device=x1.device, dtype=x1.dtype)
        t = float(torch.rand((), generator=generator))
        xt = (1 - t) * x0 + t * x1
        return F.mse_loss(self.velocity(xt, t, self.cond(cond)), x1 - x0)
