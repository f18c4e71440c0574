"""Mel -> waveform with streaming Griffin-Lim in torch (CPU or GPU): no vocoder weights to download.

Each micro-turn reconstructs its 20 new frames together with the last CONTEXT frames of the previous
micro-turn, whose magnitudes and phases are carried as state and held fixed while iterating: they
anchor the phase so consecutive micro-turns join up. Frame f owns the samples around its centre,
[f*HOP + 360, f*HOP + 600), so the 20 new frames yield exactly 4800 samples. A neural vocoder would
sound better; this one needs nothing but the mel.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from models.interaction.config import FRAMES_PER_TURN
from models.interaction.dmel import mel_filterbank
from models.interaction.layers import tile_matmul

RATE = 24_000
N_FFT = 960  # 40 ms window
HOP = 240  # 10 ms, the flow head's frame rate
BINS = N_FFT // 2 + 1
CONTEXT = 3  # frames carried from the previous micro-turn
# The flow head works in normalised log-mel: log(mel) = MEL_MEAN + MEL_STD * x.
MEL_MEAN, MEL_STD = -4.0, 2.0
LOG_MAX = 4.0  # clamp so an untrained head cannot blow the output up


class GriffinLim:
    def __init__(self, n_mels: int, iters: int, device: torch.device) -> None:
        self.iters = iters
        self.window = torch.hann_window(N_FFT, periodic=True, device=device)  # [N_FFT]
        fb = mel_filterbank(n_mels, N_FFT, RATE, RATE / 2)  # [mels, BINS]
        self.inv_t = torch.linalg.pinv(fb.double()).float().T.contiguous().to(device)  # [mels, BINS]
        self.frames = CONTEXT + FRAMES_PER_TURN
        self.length = (self.frames - 1) * HOP + N_FFT
        ones = self.window.pow(2)[None, :, None].expand(1, N_FFT, self.frames)
        self.wss = self._fold(ones).clamp(min=1e-3)  # [1, L]: window-square sum for OLA normalisation
        self.start = CONTEXT * HOP + (N_FFT - HOP) // 2  # first sample owned by the first new frame

    def initial_state(self, device: torch.device) -> tuple[Tensor, Tensor]:
        z = torch.zeros(CONTEXT, BINS, device=device)
        return z, z.clone()  # magnitude, phase of the context frames

    def _fold(self, cols: Tensor) -> Tensor:  # [B, N_FFT, F] -> [B, L] overlap-added
        out = F.fold(cols, output_size=(1, self.length), kernel_size=(1, N_FFT), stride=(1, HOP))
        return out.reshape(cols.shape[0], self.length)

    def _istft(self, mag: Tensor, phase: Tensor) -> Tensor:  # [B, F, BINS] -> [B, L]
        frames = torch.fft.irfft(torch.polar(mag, phase), n=N_FFT, dim=-1) * self.window  # [B, F, N_FFT]
        return self._fold(frames.transpose(1, 2)) / self.wss

    def _phase(self, y: Tensor) -> Tensor:  # [B, L] -> phase [B, F, BINS]
        return torch.angle(torch.fft.rfft(y.unfold(1, N_FFT, HOP) * self.window, dim=-1))

    def __call__(
        self, logmel_norm: Tensor, ctx_mag: Tensor, ctx_phase: Tensor, det: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """logmel_norm [B, 20, mels]; ctx_mag, ctx_phase [B, CONTEXT, BINS]
        -> audio [B, 4800] float32 in [-1, 1], new ctx_mag, new ctx_phase."""
        b = logmel_norm.shape[0]
        logmel = (MEL_MEAN + MEL_STD * logmel_norm.float()).clamp(max=LOG_MAX)
        new_mag = tile_matmul(torch.exp(logmel), self.inv_t, det).clamp(min=0.0)  # [B, 20, BINS]
        mag = torch.cat([ctx_mag, new_mag], dim=1)  # [B, F, BINS]
        phase = torch.cat([ctx_phase, torch.zeros_like(new_mag)], dim=1)
        for _ in range(self.iters):
            est = self._phase(self._istft(mag, phase))
            phase = torch.cat([ctx_phase, est[:, CONTEXT:]], dim=1)  # context phases stay anchored
        y = self._istft(mag, phase)[:, self.start : self.start + FRAMES_PER_TURN * HOP]
        assert y.shape == (b, FRAMES_PER_TURN * HOP), y.shape
        return y.clamp(-1.0, 1.0), mag[:, -CONTEXT:].contiguous(), phase[:, -CONTEXT:].contiguous()
