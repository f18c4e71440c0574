"""Importing the `moshi` package (an optional dependency) the way this server needs it."""

from __future__ import annotations

import os
import sys
from types import ModuleType

INSTALL_HINT = "install it with `make setup-moshi` (pip install --no-deps moshi==0.2.13 einops sentencepiece)"


def import_moshi(device: str | None = None) -> ModuleType:
    """`moshi` with its submodules loaded; on a CPU with torch.compile off.

    moshi wraps its RoPE, gating and attention helpers in `torch.compile` when the package is imported,
    unless NO_TORCH_COMPILE is set: on a CPU that is a 14.5 s cold compile at the first step and another
    for every new batch shape, for nothing a step gains. So on a CPU (or when the device is not known
    and no GPU is present) the variable is set before the first import. A GPU keeps moshi's default.
    """
    if "moshi" not in sys.modules:
        on_cpu = device is not None and device.startswith("cpu")
        if device is None:
            import torch

            on_cpu = not torch.cuda.is_available()
        if on_cpu:
            os.environ.setdefault("NO_TORCH_COMPILE", "1")
    try:
        import moshi
        import moshi.conditioners
        import moshi.models.lm
        import moshi.models.loaders
        import moshi.utils.compile
    except ImportError as e:
        raise ImportError(f"--model moshi needs the `moshi` package ({e}); {INSTALL_HINT}") from e
    return moshi
