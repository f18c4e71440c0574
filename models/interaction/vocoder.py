"""Mel -> waveform with streaming Griffin-Lim in torch (CPU or GPU): no vocoder weights to download.

Each micro-turn reconstructs its 20 new frames together with the last CONTEXT frames of the previous
micro-turn, whose magnitudes and phases are carried as state and held fixed while iterating: they
anchor the phase so consecutive micro-turns join up. Frame f owns the samples around its centre,
[f*HOP + 360, f*HOP + 600), so the 20 new frames yield exactly 4800 samples. A neural vocoder would
sound better; this one needs nothing but the mel.
"""

import functools

import numpy as np
import torch
from torch import Tensor

from models.interaction.config import FRAMES_PER_TICK
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


def unit_phasors(spec: Tensor) -> Tensor:
    """Complex [...] -> unit phasors as real [..., 2] (re, im), 0 where spec is 0.

    Written with mul, add, sqrt and div only: those round the same in vectorised and scalar code, so
    a row's bits do not depend on whether it lands in a kernel's scalar tail (which moves with the
    batch size when a row is not a whole number of vectors, e.g. 20 x 481 bins). torch.sgn / abs on
    complex numbers do not promise that.
    """
    x = torch.view_as_real(spec)
    re, im = x.unbind(-1)
    norm = torch.sqrt(re * re + im * im).clamp(min=1e-30)
    return x / norm[..., None]


@functools.lru_cache(maxsize=4)
def _mel_inverse(n_mels: int) -> Tensor:
    """The filterbank's pseudo-inverse, transposed [mels, BINS], once per process. numpy's, not torch's:
    torch's SVD on its default intra-op threads took 2.2 s on a loaded 2-core machine (5 ms on one
    thread), paid by every model and trainer built."""
    fb = mel_filterbank(n_mels, N_FFT, RATE, RATE / 2).double().numpy()  # [mels, BINS]
    return torch.from_numpy(np.linalg.pinv(fb)).float().T.contiguous()


class GriffinLim:
    """Streaming Griffin-Lim. Phases are carried as unit phasors (re, im), not angles: an iteration
    then needs no atan2/cos/sin, and the overlap-add is four shifted adds (N_FFT = 4 * HOP) instead of
    a general fold. Same algorithm as angle-based Griffin-Lim up to rounding.
    """

    def __init__(self, n_mels: int, iters: int, device: torch.device) -> None:
        assert N_FFT % HOP == 0, "the overlap-add below cuts frames into whole hops"
        self.iters = iters
        self.window = torch.hann_window(N_FFT, periodic=True, device=device)  # [N_FFT]
        self.inv_t = _mel_inverse(n_mels).to(device)  # [mels, BINS]
        self.frames = CONTEXT + FRAMES_PER_TICK
        self.length = (self.frames - 1) * HOP + N_FFT
        ones = self.window.pow(2)[None, None].expand(1, self.frames, N_FFT)
        self.inv_wss = 1.0 / self._overlap_add(ones).clamp(min=1e-3)  # [1, L]: window-square sum, inverted
        self.start = CONTEXT * HOP + (N_FFT - HOP) // 2  # first sample owned by the first new frame

    def initial_state(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """Magnitudes [CONTEXT, BINS] and unit phasors [CONTEXT, BINS, 2] (re, im) of the context frames."""
        mag = torch.zeros(CONTEXT, BINS, device=device)
        phase = torch.zeros(CONTEXT, BINS, 2, device=device)
        phase[..., 0] = 1.0  # phase 0
        return mag, phase

    def _overlap_add(self, frames: Tensor, out: Tensor | None = None, first: int = 0) -> Tensor:
        """Add frames [B, f, N_FFT] whose first one is frame `first` into out [B, L] (zeros if None)."""
        b, f = frames.shape[:2]
        k = N_FFT // HOP
        parts = frames.reshape(b, f, k, HOP)
        hops = frames.new_zeros(b, self.frames + k - 1, HOP) if out is None else out.reshape(b, -1, HOP)
        for j in range(k):  # hop j of frame i lands on output hop i + j
            hops[:, first + j : first + j + f] += parts[:, :, j]
        return hops.reshape(b, self.length)

    def _frames(self, mag: Tensor, phasors: Tensor) -> Tensor:
        """mag [B, f, BINS], phasors [B, f, BINS, 2] -> windowed frames [B, f, N_FFT]."""
        spec = torch.view_as_complex((mag[..., None] * phasors).contiguous())
        return torch.fft.irfft(spec, n=N_FFT, dim=-1) * self.window

    def _phasors(self, y: Tensor) -> Tensor:  # [B, L] -> unit phasors of the new frames [B, 20, BINS, 2]
        frames = y.unfold(1, N_FFT, HOP)[:, CONTEXT:] * self.window  # [B, 20, N_FFT]
        return unit_phasors(torch.fft.rfft(frames, dim=-1))

    def __call__(
        self, logmel_norm: Tensor, ctx_mag: Tensor, ctx_phase: Tensor, det: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """logmel_norm [B, 20, mels]; ctx_mag [B, CONTEXT, BINS], ctx_phase [B, CONTEXT, BINS, 2] unit phasors
        -> audio [B, 4800] float32 in [-1, 1], new ctx_mag, new ctx_phase."""
        b = logmel_norm.shape[0]
        logmel = (MEL_MEAN + MEL_STD * logmel_norm.float()).clamp(max=LOG_MAX)
        new_mag = tile_matmul(torch.exp(logmel), self.inv_t, det).clamp(min=0.0)  # [B, 20, BINS]
        # The context frames are held fixed (they anchor the phase): their overlap-added signal is
        # computed once, and each iteration only transforms the 20 new frames.
        ctx = self._overlap_add(self._frames(ctx_mag, ctx_phase))  # [B, L]
        est = torch.zeros(*new_mag.shape, 2, device=new_mag.device)
        est[..., 0] = 1.0  # new frames start at phase 0
        for _ in range(self.iters):
            y = self._overlap_add(self._frames(new_mag, est), ctx.clone(), CONTEXT) * self.inv_wss
            est = self._phasors(y)  # [B, 20, BINS, 2]
        y = self._overlap_add(self._frames(new_mag, est), ctx, CONTEXT) * self.inv_wss
        y = y[:, self.start : self.start + FRAMES_PER_TICK * HOP]
        assert y.shape == (b, FRAMES_PER_TICK * HOP), y.shape
        # The next micro-turn's context: the last frames' magnitudes and their final phasors.
        return y.clamp(-1.0, 1.0), new_mag[:, -CONTEXT:].contiguous(), est[:, -CONTEXT:].contiguous()
