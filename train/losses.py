"""Training losses on head outputs of the batched path: one function per head, one SFT sum, one RL term.

All take rows = micro-turns ([B*N] episode-major) and return scalars; masks select where a head is
judged (text only where the label says "speak", mel only where the assistant really emits audio).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from models.interaction.config import ACTIONS
from models.interaction.flow import TIME_DIM, FlowHead
from models.interaction.model import HeadOutputs, TickFeatures

SPEAK = ACTIONS.index("speak")
SILENT = ACTIONS.index("silent")


@dataclass
class Batch:
    """B episodes of N micro-turns, rows episode-major: inputs and every label the losses need."""

    feats: TickFeatures  # [B*N] rows
    n_ticks: int
    control: Tensor  # [B*N] int64 action labels
    user_speaking: Tensor  # [B*N] float 0/1
    text: Tensor  # [B*N, text_tokens] int64 bytes (NO_BYTE = none)
    transcript: Tensor  # [B*N, transcript_tokens] int64
    mel: Tensor  # [B*N, 20, mels] float target normalised log-mel
    mel_mask: Tensor  # [B*N] bool: the assistant emits audio in this micro-turn
    # RL only: per-row advantage of the action in `control` (zeros for SFT)
    advantage: Tensor | None = None

    @property
    def rows(self) -> int:
        return int(self.control.shape[0])

    def to(self, device: torch.device) -> "Batch":
        moved: dict[str, Any] = {
            k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(self).items() if k != "feats"
        }
        f = self.feats.to(device)
        return Batch(feats=f, **moved)


@dataclass
class LossWeights:
    control: float = 1.0
    vad: float = 0.3
    text: float = 0.5
    transcript: float = 0.1
    flow: float = 1.0
    # class weights of the control head, ACTIONS order: rare decisions (yield, delegate, backchannel)
    # would otherwise be drowned by "silent"
    classes: list[float] = field(default_factory=lambda: [1.0, 0.5, 2.0, 4.0, 4.0])
    # extra weight on the micro-turn where speech starts: continuing is easy (the model hears and
    # reads itself), taking the floor at the right moment is the decision that matters
    onset: float = 4.0
    # extra weight on staying silent in the first `hold_ticks` micro-turns after the user stops (a
    # mid-sentence pause, the beat before a reply): the other half of taking the floor at the right
    # moment; 1.0 = none
    hold: float = 1.0
    hold_ticks: int = 10


def time_embeddings(t: Tensor) -> Tensor:
    """t [R] in [0, 1] -> [R, TIME_DIM]; row r equals flow.time_embedding(float(t[r]))."""
    freqs = torch.exp(-math.log(1000.0) * torch.arange(TIME_DIM // 2, device=t.device) / (TIME_DIM // 2))
    ang = t[:, None] * 1000.0 * freqs
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)


def flow_loss(flow: FlowHead, cond: Tensor, mel: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Rectified flow with one time per row: cond [R, M, dim], mel [R, 20, mels] -> scalar MSE.

    FlowHead.loss draws one t for the whole batch; a time per row covers [0, 1] within every step.
    """
    r, m = cond.shape[:2]
    x1 = mel.reshape(r, m, flow.width).to(cond.dtype)
    x0 = torch.randn(x1.shape, generator=generator, dtype=torch.float32).to(x1.device, x1.dtype)
    t = torch.rand(r, generator=generator).to(x1.device)
    tt = t[:, None, None].to(x1.dtype)
    xt = (1 - tt) * x0 + tt * x1
    temb = flow.time(time_embeddings(t).to(cond.dtype))[:, None]  # [R, 1, hidden]
    h = F.silu(flow.inp(xt) + flow.cond(cond) + temb)
    v = flow.out(F.silu(flow.mid(h)))
    return F.mse_loss(v.float(), (x1 - x0).float())


def sft_loss(
    out: HeadOutputs, batch: Batch, flow: FlowHead, w: LossWeights, generator: torch.Generator | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Supervised sum over the heads -> (loss, metrics)."""
    na = len(ACTIONS)
    logits = out.control.float()
    cw = torch.tensor(w.classes, device=logits.device)[batch.control]  # [R]
    c = batch.control.view(-1, batch.n_ticks)
    onset = (c == SPEAK) & (F.pad(c, (1, 0), value=-1)[:, :-1] != SPEAK)  # [B, N]
    rw = cw * torch.where(onset.reshape(-1), w.onset, 1.0)
    if w.hold != 1.0:
        us = batch.user_speaking.view(-1, batch.n_ticks)
        # the user spoke in one of the hold_ticks micro-turns before this one, and is quiet now
        recent = F.max_pool1d(F.pad(us, (w.hold_ticks, 0))[:, None, :-1], w.hold_ticks, stride=1)[:, 0]
        hold = (c == SILENT) & (recent > 0) & (us == 0)
        rw = rw * torch.where(hold.reshape(-1), w.hold, 1.0)
    ctrl = (F.cross_entropy(logits[:, :na], batch.control, reduction="none") * rw).sum() / rw.sum()
    vad = F.binary_cross_entropy_with_logits(logits[:, na], batch.user_speaking)
    speak = batch.control == SPEAK
    text = (
        F.cross_entropy(out.text[speak].flatten(0, 1).float(), batch.text[speak].flatten())
        if bool(speak.any()) else logits.new_zeros(())
    )
    tr = F.cross_entropy(out.transcript.flatten(0, 1).float(), batch.transcript.flatten())
    mm = batch.mel_mask
    fl = flow_loss(flow, out.audio_cond[mm], batch.mel[mm], generator) if bool(mm.any()) else logits.new_zeros(())
    loss = w.control * ctrl + w.vad * vad + w.text * text + w.transcript * tr + w.flow * fl
    with torch.no_grad():
        acc = (logits[:, :na].argmax(-1) == batch.control).float().mean()
    parts = {"loss": loss, "control": ctrl, "vad": vad, "text": text, "transcript": tr, "flow": fl}
    return loss, {**{k: float(v.detach()) for k, v in parts.items()}, "control_acc": float(acc)}


def policy_gradient_loss(
    out: HeadOutputs, batch: Batch, flow: FlowHead, w: LossWeights, generator: torch.Generator | None = None
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE on the control head: -advantage * log p(action taken), mean over rows.

    batch.control holds the actions the policy took (from `sample`), batch.advantage their reward
    minus a baseline (e.g. from bench.fdbench's timing metrics).
    """
    if batch.advantage is None:
        raise ValueError("policy_gradient_loss needs batch.advantage (reward - baseline per micro-turn)")
    logp = F.log_softmax(out.control[:, : len(ACTIONS)].float(), -1)
    taken = logp.gather(1, batch.control[:, None])[:, 0]
    loss = -(batch.advantage * taken).mean()
    return loss, {"loss": float(loss.detach()), "mean_advantage": float(batch.advantage.mean())}


LossFn = Callable[
    [HeadOutputs, Batch, FlowHead, LossWeights, "torch.Generator | None"], tuple[Tensor, dict[str, float]]
]
LOSSES: dict[str, LossFn] = {"sft": sft_loss, "policy_gradient": policy_gradient_loss}
