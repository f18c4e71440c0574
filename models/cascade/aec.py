"""Acoustic echo cancellation: removing the assistant's own voice from the user's microphone signal.

The model knows exactly what it played, so echo is subtracted rather than guessed: each micro-turn
the input (16 kHz) is cross-correlated against the last `max_delay` of played audio; if some delay
explains the input well (normalised correlation >= `min_corr`), the best-fitting scaled copy of the
played audio at that delay is subtracted. What is left is the user (plus residual echo) and is what
the VAD and ASR see. A single-tap canceller does not model room reverberation; clients should also
run their own acoustic echo cancellation (browsers do by default), and the policy keeps a second,
semantic guard (overlapped speech whose words the assistant just said is not a barge-in).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streaming.types import Audio


@dataclass
class EchoCanceller:
    """Per-session state: a ring of recently played audio at the analysis rate."""

    max_delay: int  # samples of played history searched for the echo
    min_corr: float = 0.3
    history: Audio | None = None  # [max_delay + tick] played audio, oldest first
    last_corr: float = 0.0  # best normalised correlation of the last tick (for metrics / tests)
    last_delay: int = -1  # delay in samples of the last cancelled tick, -1 when nothing was cancelled

    def played(self, audio: Audio) -> None:
        """Record audio the assistant has just emitted (already at the analysis rate)."""
        if self.history is None:
            self.history = np.zeros(self.max_delay + len(audio), dtype=np.float32)
        n = len(audio)
        if n >= len(self.history):
            self.history = audio[-len(self.history) :].astype(np.float32)
        else:
            self.history = np.concatenate([self.history[n:], audio]).astype(np.float32)

    def process(self, x: Audio) -> Audio:
        """Input tick -> input with the best-matching echo of recent output removed."""
        self.last_corr, self.last_delay = 0.0, -1
        h = self.history
        n = len(x)
        if h is None or len(h) < n or not np.any(h) or not np.any(x):
            return x
        # corr[d] = <x, h[len(h) - n - d : len(h) - d]> for delay d in [0, len(h) - n].
        size = 1 << int(np.ceil(np.log2(len(h) + n)))
        spec = np.fft.rfft(h, size) * np.conj(np.fft.rfft(x, size))
        full = np.fft.irfft(spec, size)  # full[k] = sum_t h[t + k] x[t]
        lags = np.arange(len(h) - n, -1, -1)  # k for d = 0, 1, ...
        dots = full[lags]
        # Energy of each candidate segment from a cumulative sum: [len(h) - n + 1].
        c = np.concatenate([[0.0], np.cumsum(h.astype(np.float64) ** 2)])
        seg_energy = c[lags + n] - c[lags]
        ex = float(np.dot(x, x))
        with np.errstate(divide="ignore", invalid="ignore"):
            corr = np.where(seg_energy > 1e-9, dots / np.sqrt(seg_energy * ex), 0.0)
        d = int(np.argmax(corr))
        self.last_corr = float(corr[d])
        if self.last_corr < self.min_corr:
            return x
        k = int(lags[d])
        seg = h[k : k + n]
        gain = float(dots[d] / seg_energy[d])
        self.last_delay = d
        return (x - gain * seg).astype(np.float32)
