"""The feature cache as batches, with a data position that a resumed run continues from exactly."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from models.interaction.config import InteractionConfig
from models.interaction.model import TickFeatures
from models.interaction.video import PATCH
from train.features import load_cache
from train.losses import Batch


@dataclass
class DataPosition:
    epoch: int = 0
    index: int = 0  # batches already taken in this epoch

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}


class EpisodeData:
    def __init__(self, path: Path, cfg: InteractionConfig, seed: int = 0) -> None:
        self.arrays: dict[str, npt.NDArray[Any]] = load_cache(path)
        self.cfg, self.seed = cfg, seed
        self.episodes, self.ticks = self.arrays["control"].shape[:2]
        if cfg.heard_tokens and "heard" not in self.arrays:
            raise ValueError(f"{path} was built before the heard-words channel existed; the model reads it "
                             "(heard_tokens > 0): build a new cache into an empty folder")
        self.pos = DataPosition()

    def order(self, epoch: int) -> npt.NDArray[np.int64]:
        """The episode order of an epoch: a permutation seeded by (seed, epoch), the same on resume."""
        return np.random.default_rng([self.seed, epoch]).permutation(self.episodes)

    def next_batch(self, size: int) -> Batch:
        per_epoch = self.episodes // size
        if per_epoch == 0:
            raise ValueError(f"batch size {size} is larger than the {self.episodes} episodes in the cache")
        if self.pos.index >= per_epoch:
            self.pos = DataPosition(self.pos.epoch + 1, 0)
        idx = self.order(self.pos.epoch)[self.pos.index * size : (self.pos.index + 1) * size]
        self.pos = DataPosition(self.pos.epoch, self.pos.index + 1)
        return self.batch(idx)

    def batch(self, idx: npt.NDArray[np.int64] | list[int]) -> Batch:
        a, cfg = self.arrays, self.cfg
        rows = len(idx) * self.ticks

        def take(name: str, dtype: torch.dtype) -> torch.Tensor:
            x = torch.from_numpy(np.ascontiguousarray(a[name][idx]))
            return x.reshape(rows, *x.shape[2:]).to(dtype)

        feats = TickFeatures(
            user_dmel=take("user_dmel", torch.long),
            self_dmel=take("self_dmel", torch.long),
            video=torch.zeros(rows, cfg.video_grid**2, PATCH, PATCH, 3),
            video_present=torch.zeros(rows, dtype=torch.bool),
            typed=take("typed", torch.long),
            background=take("background", torch.long),
            own_text=take("own_text", torch.long),
            heard=take("heard", torch.long)[:, : cfg.heard_tokens] if cfg.heard_tokens else None,
        )
        return Batch(
            feats=feats, n_ticks=self.ticks,
            control=take("control", torch.long),
            user_speaking=take("user_speaking", torch.float32),
            text=take("text", torch.long),
            transcript=take("transcript", torch.long),
            mel=take("mel", torch.float32),
            mel_mask=take("mel_mask", torch.bool),
        )
