"""Is the user's speech over the assistant an interruption or a backchannel? A probe on Whisper's encoder.

When the user starts talking while the assistant speaks, the only cue the cascade used to have early
on was how long the speech had lasted, and the two kinds of overlap are not told apart by length
soon enough: a synthetic "mm-hm" has 600-1000 ms of VAD speech, "Wait, stop." 670 ms. What they say
is what differs ("mm-hm", "yeah", "right" against "wait", "hold on", "sorry, but"), and Whisper's
encoder, trained on 680,000 hours of real speech, already represents that. So this is a logistic
probe on the encoder's frames of the overlap's first few hundred ms: the mean of the frames that hold
it and the mean of its last 100 ms, standardised, one linear layer. ~4 ms per call on one core.

Trained by `python -m train.overlap` (train/overlap.py) on synthetic overlaps (Piper joe and the
espeak-ng voices at random rates, pitches, levels and noise), which also writes the weights file's
metadata: the command, seed, commit and its cross-validated accuracy. Measured there: it knows the
backchannel *words* it was trained on in voices it has not heard, not backchannel words it has never
seen (held out by text it is at chance): the lexicon of backchannels is small and closed, and it is
that lexicon the probe learns.

Model code only (numpy); the Whisper model comes from the caller (`WhisperTranscriber`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from models.speech.sphinx import ASR_RATE
from streaming.types import Audio

WINDOW_S = 1.0  # the encoder's window: the clip is at most this long (its end is kept)
LEAD_S = 0.1  # silence before the clip inside the window
CONTEXT_S = 0.1  # audio before the overlap's detected onset that the clip starts with
TAIL_FRAMES = 5  # the last 100 ms of the clip, pooled apart: what is being said *now*
DEFAULT_WEIGHTS = Path(__file__).parent / "weights" / "overlap-probe.npz"


class OverlapProbeError(RuntimeError):
    pass


class Encoder(Protocol):
    def encode(self, audio: Audio, seconds: float, lead_s: float) -> Audio: ...


def onset_index(audio_len: int, consumed: int, onset_ms: float) -> int:
    """Where media time `onset_ms` (the VAD's clock: 16 kHz samples from the stream's start) falls in a
    clip of the stream's last `audio_len` samples, `consumed` samples having been streamed so far."""
    return audio_len - (consumed - round(onset_ms * ASR_RATE / 1000))


def clip_for(audio: Audio, onset: int) -> Audio:
    """The part of `audio` (16 kHz, ending now) the probe judges: from `CONTEXT_S` before the overlap's
    onset (a sample index into `audio`) to its end."""
    return audio[max(0, onset - round(CONTEXT_S * ASR_RATE)) :]


def features(encoder: Encoder, clip: Audio) -> npt.NDArray[np.float32]:
    """[2 * width]: the mean encoder frame of the clip and the mean of its last `TAIL_FRAMES`."""
    frames = encoder.encode(clip, WINDOW_S, LEAD_S)
    return np.concatenate([frames.mean(0), frames[-TAIL_FRAMES:].mean(0)]).astype(np.float32)


@dataclass
class ProbeWeights:
    mean: npt.NDArray[np.float32]  # feature standardisation
    std: npt.NDArray[np.float32]
    w: npt.NDArray[np.float32]  # logistic layer: P(interruption) = sigmoid(w . z + b)
    b: float
    meta: dict[str, Any]  # how it was made (train/overlap.py)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(
            path,
            mean=self.mean.astype(np.float16),
            std=self.std.astype(np.float16),
            w=self.w.astype(np.float32),
            b=np.float32(self.b),
            meta=np.array(json.dumps(self.meta)),
        )

    @classmethod
    def load(cls, path: Path) -> ProbeWeights:
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls(
                    z["mean"].astype(np.float32),
                    z["std"].astype(np.float32),
                    z["w"].astype(np.float32),
                    float(z["b"]),
                    json.loads(str(z["meta"])),
                )
        except (OSError, KeyError, ValueError) as e:
            raise OverlapProbeError(
                f"cannot read the overlap probe {path} ({e}); retrain it with `python -m train.overlap`"
            ) from None

    def probability(self, x: npt.NDArray[np.float32]) -> float:
        if x.shape != self.mean.shape:
            raise OverlapProbeError(f"probe expects {self.mean.shape[0]} features, got {x.shape}: "
                                    "it was trained on another Whisper model; retrain with `python -m train.overlap`")
        z = (x - self.mean) / self.std
        return float(1.0 / (1.0 + np.exp(-(float(z @ self.w) + self.b))))


class OverlapProbe:
    """P(the overlap is an interruption) from the start of the overlap's audio."""

    def __init__(self, encoder: Encoder, path: Path = DEFAULT_WEIGHTS) -> None:
        self.encoder = encoder
        self.weights = ProbeWeights.load(path)

    def mismatch(self, early_ms: int) -> str | None:
        """Why these weights do not fit a cascade that asks at `early_ms` of overlap speech, or None.
        They still run, on clips longer or shorter than they learned from: less accurate."""
        trained = self.weights.meta.get("early_ms")
        if trained is None or trained == early_ms:
            return None
        return (
            f"the overlap probe was trained for barge_in_early_ms={trained}, not {early_ms}; retrain it "
            f"with `python -m train.overlap --early-ms {early_ms}` for this setting"
        )

    def probability(self, audio: Audio, onset: int) -> float:
        """`audio`: the session's recent 16 kHz input, ending now; `onset`: the overlap's first sample in it."""
        return self.weights.probability(features(self.encoder, clip_for(audio, onset)))
