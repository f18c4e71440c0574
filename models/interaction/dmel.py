"""dMel audio input (Bai et al., "dMel: Speech Tokenization made Simple", arXiv 2407.15835).

Log-mel filterbank energies, clamped and quantised to a few levels per bin, embedded as a *bag* of
per-bin embeddings (one table row per (bin, level); a frame is the sum of its 80 rows). No encoder,
no codebook, nothing downloaded.

The paper's frames are 80 bins at 16 kHz, 25 ms windows every 10 ms. Audio here is 24 kHz, so the
same frames are computed at 24 kHz (600-sample window, 240-sample hop) with mel filters spanning
0-8 kHz: that is the 16 kHz analysis without a resampler in the loop (and without its state).
"""

import math

import torch
from torch import Tensor, nn

from models.interaction.config import FRAMES_PER_TICK, InteractionConfig
from models.interaction.layers import Lin, tile_matmul

RATE = 24_000
WIN = 600  # 25 ms
HOP = 240  # 10 ms
CONTEXT = WIN - HOP  # samples of the previous micro-turn the first frame reaches back into
LOG_LO, LOG_HI = -9.0, 5.0  # natural-log mel magnitude range kept; silence sits at LOG_LO


def mel_filterbank(n_mels: int, n_fft: int, rate: int, f_max: float) -> Tensor:
    """HTK-mel triangular filters [n_mels, n_fft//2 + 1], peak 1."""

    def mel(f: Tensor) -> Tensor:
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    freqs = torch.linspace(0, rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    edges_mel = torch.linspace(
        0.0, float(mel(torch.tensor(f_max, dtype=torch.float64))), n_mels + 2, dtype=torch.float64
    )
    edges = 700.0 * (10 ** (edges_mel / 2595.0) - 1.0)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs[None] - lo) / (mid - lo)
    down = (hi - freqs[None]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0.0).float()


class DMelFrontend:
    """Waveform -> dMel levels. Stateless: the caller passes the previous CONTEXT samples in front."""

    def __init__(self, n_mels: int, levels: int, device: torch.device) -> None:
        self.levels = levels
        self.window = torch.hann_window(WIN, periodic=True, device=device)  # [WIN]
        self.fb_t = mel_filterbank(n_mels, WIN, RATE, 8000.0).to(device).T.contiguous()  # [WIN//2+1, mels]

    def __call__(self, audio: Tensor, det: bool) -> Tensor:
        """audio [B, CONTEXT + 4800] float32 -> levels [B, 20, n_mels] int64 in [0, levels)."""
        assert audio.shape[1] == CONTEXT + FRAMES_PER_TICK * HOP, f"want [B, {CONTEXT + 4800}], got {audio.shape}"
        frames = audio.unfold(1, WIN, HOP) * self.window  # [B, 20, WIN]
        # |X| from mul/add/sqrt (not complex abs): same bits in vectorised and scalar code, so a row's
        # levels cannot depend on where the batch size puts the kernel's scalar tail.
        re, im = torch.view_as_real(torch.fft.rfft(frames, dim=-1)).unbind(-1)
        mag = torch.sqrt(re * re + im * im)  # [B, 20, WIN//2+1]
        logmel = torch.log(tile_matmul(mag, self.fb_t, det) + math.exp(LOG_LO))  # [B, 20, mels]
        q = (logmel.clamp(LOG_LO, LOG_HI) - LOG_LO) * (self.levels / (LOG_HI - LOG_LO))
        return q.floor().long().clamp(0, self.levels - 1)


class DMelEmbed(nn.Module):
    """levels [B, 20, bins] -> tokens [B, audio_tokens, dim]: bag of per-bin embeddings, frames grouped."""

    offset: Tensor  # [bins] first table row of each bin

    def __init__(self, cfg: InteractionConfig) -> None:
        super().__init__()
        self.bins, self.levels, self.tokens = cfg.dmel_bins, cfg.dmel_levels, cfg.audio_tokens
        self.table = nn.Embedding(cfg.dmel_bins * cfg.dmel_levels, cfg.dmel_embed)
        self.register_buffer("offset", torch.arange(cfg.dmel_bins) * cfg.dmel_levels, persistent=False)
        self.group = Lin(FRAMES_PER_TICK // cfg.audio_tokens * cfg.dmel_embed, cfg.dim)

    def forward(self, levels: Tensor) -> Tensor:
        b = levels.shape[0]
        frames = self.table(levels + self.offset).sum(dim=2)  # [B, 20, E]: sum over the bag of bins
        return self.group(frames.reshape(b, self.tokens, -1))  # [B, tokens, dim]
