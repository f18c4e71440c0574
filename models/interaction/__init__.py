"""The native interaction model: an encoder-free streaming transformer with persistent per-session KV.

`load_native("tiny")` is what `duplex serve --model native:tiny [--checkpoint FILE]` calls.

Environment knobs (the CLI has no flags for them):
  DUPLEX_KV_BUDGET_MB         KV pool size; default 512 on CPU, 85% of free GPU memory on CUDA
  DUPLEX_NATIVE_DETERMINISTIC 1 = batch-invariant mode (bit-identical alone or batched), 0 = fast
  DUPLEX_TORCH_THREADS        intra-op threads on CPU; default: every core this process may use
"""

import contextlib
import logging
import os

import torch

from models.interaction.checkpoint import build, parameter_count, save_checkpoint
from models.interaction.config import PRESETS, InteractionConfig, preset
from models.interaction.kv import KVPool, PoolFullError
from models.interaction.model import InteractionTransformer, TurnFeatures, init_weights
from models.interaction.runtime import NativeModel, NativeSession

__all__ = [
    "PRESETS",
    "InteractionConfig",
    "InteractionTransformer",
    "KVPool",
    "NativeModel",
    "NativeSession",
    "PoolFullError",
    "TurnFeatures",
    "init_weights",
    "load_native",
    "parameter_count",
    "preset",
    "save_checkpoint",
    "set_cpu_threads",
    "slots_for_budget",
]
log = logging.getLogger(__name__)


def set_cpu_threads() -> int:
    """One inference thread calls step; let its matmuls use the cores this process may run on."""
    n = int(os.environ.get("DUPLEX_TORCH_THREADS", "0")) or len(os.sched_getaffinity(0))
    torch.set_num_threads(n)
    # No inter-op parallelism in one fixed-shape step. Fails if already set or work already ran: harmless.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    return n


def slots_for_budget(cfg: InteractionConfig, dtype: torch.dtype, budget_bytes: int, what: str) -> int:
    per = KVPool.session_bytes(cfg, dtype)
    n = budget_bytes // per
    if n < 1:
        raise ValueError(
            f"KV budget of {budget_bytes / 2**20:.1f} MiB cannot hold even one {what} session "
            f"({per / 2**20:.1f} MiB each); raise DUPLEX_KV_BUDGET_MB or use a smaller preset"
        )
    return int(n)


def load_native(
    preset_name: str = "tiny",
    checkpoint: str | None = None,
    device: str | None = None,
    kv_budget_mb: float | None = None,
    deterministic: bool | None = None,
) -> NativeModel:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch sees no CUDA GPU; use --device cpu")
    if dev.type == "cpu":
        set_cpu_threads()
    net = build(preset_name, checkpoint)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    net = net.to(device=dev, dtype=dtype)
    if kv_budget_mb is None and os.environ.get("DUPLEX_KV_BUDGET_MB"):
        kv_budget_mb = float(os.environ["DUPLEX_KV_BUDGET_MB"])
    if kv_budget_mb is None:
        budget = int(torch.cuda.mem_get_info(dev)[0] * 0.85) if dev.type == "cuda" else 512 * 2**20
    else:
        budget = int(kv_budget_mb * 2**20)
    n_slots = slots_for_budget(net.cfg, dtype, budget, f"native:{preset_name}")
    if deterministic is None:
        deterministic = os.environ.get("DUPLEX_NATIVE_DETERMINISTIC", "1") != "0"
    model = NativeModel(net, f"native:{preset_name}", n_slots, dev, deterministic)
    log.info(
        "native:%s: %.1f M parameters on %s, %d KV slots of %.1f MiB, deterministic=%s",
        preset_name,
        parameter_count(net) / 1e6,
        dev,
        n_slots,
        model.session_bytes / 2**20,
        deterministic,
    )
    return model
