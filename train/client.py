"""The training client, in the shape Tinker exposes: forward_backward, optim_step, save/load, sample.

    tc = TrainingClient("tiny")                       # or checkpoint=..., lora_rank=8
    out = tc.forward_backward(batch, "sft")           # losses + metrics; gradients accumulate
    tc.optim_step(AdamParams(lr=2e-3))                # AdamW, clipping; clears the gradients
    tc.save_state("run/state.pt", data_position)      # weights, optimiser, step, RNG, data position
    outs = tc.sample(ticks)                           # micro-turns through the server's own NativeModel

It trains `models.interaction` exactly as it is served: the batched path (forward_batched) for
learning, `NativeModel.step` for sampling.
"""

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from models.base import TickInput, TickOutput
from models.interaction.checkpoint import INIT_SEED, add_heard_channel, build, save_checkpoint
from models.interaction.config import ACTIONS, InteractionConfig
from models.interaction.config import preset as preset_config
from models.interaction.listener import Listener
from models.interaction.model import HeadOutputs, InteractionTransformer, TickFeatures, init_weights
from models.interaction.phrases import PhraseSet
from models.interaction.serving import NativeModel
from train.lora import apply_lora, merge_lora
from train.losses import LOSSES, Batch, LossFn, LossWeights

StateFormat = "duplex-train-state-1"


@dataclass
class AdamParams:
    lr: float = 2e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.01
    clip: float = 1.0  # max global gradient norm (0 = no clipping)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 in hardware. Without it (an AVX2-only CPU) every bf16 product is
    converted to fp32 and back: measured on this project's 2-core AVX2 machines, a bf16 training step
    took ~7x as long as an fp32 one, so autocast to bf16 only pays where this is True."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        # private probes (torch.cpu has no public one); a torch without them counts as no support
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto" -> bf16 where the device has bf16 arithmetic, else fp32; bf16 and fp32 stay as asked."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


@dataclass
class ForwardBackwardOutput:
    loss: float
    metrics: dict[str, float]
    tokens: int


class TrainingClient:
    def __init__(
        self,
        preset: str = "tiny",
        checkpoint: str | None = None,
        lora_rank: int = 0,
        device: str = "cpu",
        precision: str = "auto",
        seed: int = 0,
        weights: LossWeights | None = None,
        config: InteractionConfig | None = None,
        heard_tokens: int | None = None,
    ) -> None:
        """config overrides the preset's sizes (tests train small models saved under a preset's name);
        heard_tokens gives the model the heard-words channel (models/interaction/heard.py), a checkpoint
        without it starting from exactly its old behaviour."""
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
        if precision not in ("bf16", "fp32", "auto"):
            raise ValueError(f"precision must be bf16, fp32 or auto, got {precision!r}")
        precision = resolve_precision(precision, self.device)
        self.preset, self.precision, self.lora_rank = preset, precision, lora_rank
        if checkpoint is None:
            net = InteractionTransformer(config or preset_config(preset))
            init_weights(net, INIT_SEED)
        else:
            net = build(preset, checkpoint)
        if heard_tokens is not None:
            net = add_heard_channel(net, heard_tokens)
        self.net = net.to(self.device).train()
        self.lora_params = apply_lora(self.net, lora_rank, seed=seed) if lora_rank else []
        self.weights = weights or LossWeights()
        self.step = 0
        self.generator = torch.Generator().manual_seed(seed)
        self._opt: torch.optim.AdamW | None = None

    # -- learning -----------------------------------------------------------------------------

    def params(self) -> list[torch.nn.Parameter]:
        return self.lora_params or [p for p in self.net.parameters() if p.requires_grad]

    def _autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def forward(self, batch: Batch) -> HeadOutputs:
        with self._autocast():
            return self.net.forward_batched(batch.feats, batch.n_ticks)

    def forward_backward(self, batch: Batch, loss: str | LossFn = "sft") -> ForwardBackwardOutput:
        """Forward the whole batch, add d(loss)/d(params) to the gradients; returns losses and metrics."""
        fn = LOSSES[loss] if isinstance(loss, str) else loss
        batch = batch.to(self.device)
        out = self.forward(batch)
        value, metrics = fn(out, batch, self.net.flow, self.weights, self.generator)
        value.backward()
        return ForwardBackwardOutput(float(value.detach()), metrics, batch.rows * self.net.cfg.tokens_per_tick)

    def _optimizer(self, p: AdamParams) -> torch.optim.AdamW:
        if self._opt is None:
            decay = [x for x in self.params() if x.ndim >= 2]
            rest = [x for x in self.params() if x.ndim < 2]
            self._opt = torch.optim.AdamW(
                [{"params": decay, "weight_decay": p.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                lr=p.lr, betas=(p.beta1, p.beta2), eps=p.eps,
            )
        for g in self._opt.param_groups:
            g["lr"], g["betas"], g["eps"] = p.lr, (p.beta1, p.beta2), p.eps
            g["weight_decay"] = p.weight_decay if g is self._opt.param_groups[0] else 0.0
        return self._opt

    def optim_step(self, p: AdamParams) -> dict[str, float]:
        """One AdamW update from the accumulated gradients (clipped), then zero them."""
        opt = self._optimizer(p)
        norm = torch.nn.utils.clip_grad_norm_(self.params(), p.clip) if p.clip > 0 else torch.zeros(())
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.step += 1
        return {"grad_norm": float(norm), "lr": p.lr, "step": self.step}

    # -- state --------------------------------------------------------------------------------

    def save_state(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        """Everything a stopped run needs to continue exactly: weights, optimiser, step, RNGs, extra
        (the trainer puts the data position and its own counters there). Written atomically."""
        state = {
            "format": StateFormat,
            "preset": self.preset,
            "lora_rank": self.lora_rank,
            "net": self.net.state_dict(),
            "opt": self._opt.state_dict() if self._opt else None,
            "step": self.step,
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "extra": extra or {},
        }
        path = Path(path)
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)

    def load_state(self, path: str | Path, adam: AdamParams | None = None) -> dict[str, Any]:
        state = torch.load(path, map_location=self.device, weights_only=False)
        if state.get("format") != StateFormat:
            raise ValueError(f"{path} is not a duplex training state (format {state.get('format')!r})")
        if state["preset"] != self.preset or state["lora_rank"] != self.lora_rank:
            raise ValueError(
                f"{path} was saved for preset {state['preset']} with LoRA rank {state['lora_rank']}, "
                f"not {self.preset} / {self.lora_rank}; resume with the same --preset and --lora-rank"
            )
        self.net.load_state_dict(state["net"])
        if state["opt"] is not None:
            self._optimizer(adam or AdamParams()).load_state_dict(state["opt"])
        self.step = state["step"]
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        np.random.set_state(state["numpy_rng"])
        return dict(state["extra"])

    def serving_net(self) -> InteractionTransformer:
        """A copy of the current weights as the server runs them (LoRA merged, eval mode, fp32)."""
        net = copy.deepcopy(self.net).to("cpu").float()
        merge_lora(net)
        return net.eval()

    def export(self, path: str | Path, metadata: dict[str, str] | None = None, phrase_wer: float | None = None,
               phrases: PhraseSet | None = None) -> None:
        """The served checkpoint: fp16 safetensors with config and `metadata` (command, data seed...).
        `phrase_wer`: the flow head's word error measured on these weights' held-out phrases
        (train.evaluate's voice_wer); `--voice auto` gives the flow head the voice only where it is
        recorded and low (models/interaction/voice.py), so leave it None unless it was measured."""
        save_checkpoint(self.serving_net(), path, self.preset, dtype=torch.float16, extra=metadata,
                        phrase_wer=phrase_wer, phrases=phrases)

    # -- sampling -----------------------------------------------------------------------------

    def sampler(self, n_slots: int = 1, deterministic: bool = True) -> NativeModel:
        """The server's own model adapter around the current weights (with its recogniser, when they read
        heard words: models/interaction/listener.py)."""
        return NativeModel(self.serving_net(), f"native:{self.preset}", n_slots, torch.device("cpu"), deterministic,
                           listener=Listener.for_config(self.net.cfg))

    def sample(
        self, ticks: Sequence[TickInput], session_id: str = "sample", on_step: Callable[[int], None] | None = None
    ) -> list[TickOutput]:
        """Stream micro-turns through NativeModel.step with the current weights, exactly as served."""
        return self.rollout(ticks, session_id, on_step)[0]

    def rollout(
        self, ticks: Sequence[TickInput], session_id: str = "sample", on_step: Callable[[int], None] | None = None
    ) -> tuple[list[TickOutput], TickFeatures, Tensor]:
        """`sample`, plus what RL needs: the features the model saw each micro-turn (its own audio and
        text fed back included) [N rows] and the control action it chose [N] (greedy, as served)."""
        model = self.sampler()
        st = model.open(session_id)
        trace: list[tuple[TickFeatures, HeadOutputs]] = []
        try:
            outs = []
            for i, tick in enumerate(ticks):
                outs.extend(model.step([(st, tick)], observe=lambda _, f, h: trace.append((f, h))))
                if on_step:
                    on_step(i)
        finally:
            model.close(st)
        feats = TickFeatures.cat([f for f, _ in trace])
        actions = torch.cat([h.control[:, : len(ACTIONS)].argmax(-1) for _, h in trace])
        return outs, feats, actions


def metrics_line(m: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.3f}" for k, v in m.items())

