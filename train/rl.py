"""A simple RL loop on top of the training client: roll out, score the timing, reinforce.

Reward per micro-turn comes from the episode's timing labels, the quantities Full-Duplex-Bench scores
(does it hold the floor when it should, stay quiet over the user, stop on a barge-in): +1 when the
action agrees with the label about who holds the floor (speak/backchannel vs the rest), -1 when not,
and `yield_bonus` more for yielding where the label yields. The advantage is the reward minus its
mean over the rollout (a per-rollout baseline).
"""

import numpy as np
import torch
from torch import Tensor

from models.base import TickInput
from models.interaction.config import ACTIONS
from streaming.types import TICK_SAMPLES
from train.client import AdamParams, TrainingClient
from train.data import EpisodeData
from train.losses import Batch

FLOOR = (ACTIONS.index("speak"), ACTIONS.index("backchannel"))


def timing_reward(actions: Tensor, labels: Tensor, yield_bonus: float = 1.0) -> Tensor:
    """actions, labels [N] -> reward [N]."""
    took = torch.isin(actions, torch.tensor(FLOOR))
    should = torch.isin(labels, torch.tensor(FLOOR))
    r = torch.where(took == should, 1.0, -1.0)
    y = ACTIONS.index("yield")
    return r + yield_bonus * ((actions == y) & (labels == y)).float()


def rl_step(tc: TrainingClient, data: EpisodeData, episode: int, adam: AdamParams) -> dict[str, float]:
    """One rollout of a held-out episode (needs its user audio: a cache built with keep_audio) and
    one policy-gradient update. Returns the rollout's mean reward and the loss metrics."""
    if "user_audio" not in data.arrays:
        raise ValueError("RL rollouts need the episodes' audio: build that cache with keep_audio=True")
    audio = data.arrays["user_audio"][episode].astype(np.float32)
    ticks = [TickInput(audio[k * TICK_SAMPLES : (k + 1) * TICK_SAMPLES], TICK_SAMPLES) for k in range(data.ticks)]
    _, feats, actions = tc.rollout(ticks, session_id=f"rl-{episode}")
    labels = torch.from_numpy(data.arrays["control"][episode].astype(np.int64))
    reward = timing_reward(actions, labels)
    b = data.batch([episode])
    batch = Batch(feats=feats, n_ticks=data.ticks, control=actions, user_speaking=b.user_speaking, text=b.text,
                  transcript=b.transcript, mel=b.mel, mel_mask=b.mel_mask, advantage=reward - reward.mean())
    out = tc.forward_backward(batch, "policy_gradient")
    tc.optim_step(adam)
    return {"reward": float(reward.mean()), **out.metrics}
