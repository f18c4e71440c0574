"""The native interaction model: an encoder-free streaming transformer with persistent per-session KV.

`load_native("tiny", options=...)` (loading.py) is what `duplex serve --model native:tiny [--checkpoint FILE]`
calls; its serving options (`NativeOptions`, options.py) are `duplex serve` options, whose defaults the
environment variables DUPLEX_KV_BUDGET_MB, DUPLEX_NATIVE_DETERMINISTIC, DUPLEX_TORCH_THREADS,
DUPLEX_NATIVE_MATMUL, DUPLEX_NATIVE_GRAPHS, DUPLEX_GRAPH_MAX_BATCH, DUPLEX_NATIVE_VOICE, DUPLEX_NATIVE_ONSET
and DUPLEX_NATIVE_DELEGATE override.

The names below load on first use: the command line reads `models.interaction.options` without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.interaction.checkpoint import parameter_count, save_checkpoint
    from models.interaction.config import PRESETS, InteractionConfig, preset
    from models.interaction.kv import KVPool, PoolFullError
    from models.interaction.loading import load_native, slots_for_budget
    from models.interaction.model import InteractionTransformer, TickFeatures, init_weights
    from models.interaction.options import NativeOptions
    from models.interaction.serving import NativeModel
    from models.interaction.session import NativeSession, StepObserver

_WHERE = {
    "parameter_count": "checkpoint",
    "save_checkpoint": "checkpoint",
    "PRESETS": "config",
    "InteractionConfig": "config",
    "preset": "config",
    "KVPool": "kv",
    "PoolFullError": "kv",
    "load_native": "loading",
    "slots_for_budget": "loading",
    "InteractionTransformer": "model",
    "TickFeatures": "model",
    "init_weights": "model",
    "NativeOptions": "options",
    "NativeModel": "serving",
    "NativeSession": "session",
    "StepObserver": "session",
}
__all__ = [
    "PRESETS",
    "InteractionConfig",
    "InteractionTransformer",
    "KVPool",
    "NativeModel",
    "NativeOptions",
    "NativeSession",
    "PoolFullError",
    "StepObserver",
    "TickFeatures",
    "init_weights",
    "load_native",
    "parameter_count",
    "preset",
    "save_checkpoint",
    "slots_for_budget",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{where}"), name)
