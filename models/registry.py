"""Model names accepted by `duplex serve --model` and the benchmarks, each mapped to its loader.

Imports are lazy so that `echo` starts without torch and a missing optional dependency names itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from models.base import InteractionModel

if TYPE_CHECKING:
    from models.interaction.options import NativeOptions

@dataclass
class ModelSpec:
    """Everything a model name and its options resolve to."""

    name: str  # e.g. "echo", "echo:2", "native:tiny", "cascade"
    checkpoint: str | None = None
    device: str | None = None
    native: NativeOptions | None = None  # None: the defaults, environment overrides included


def _echo(spec: ModelSpec, arg: str) -> InteractionModel:
    from models.echo import EchoModel

    try:
        delay = int(arg) if arg else 1
    except ValueError:
        raise ValueError(f"echo takes a delay in micro-turns, e.g. 'echo:2'; got {spec.name!r}") from None
    return EchoModel(delay=delay)


def _native(spec: ModelSpec, arg: str) -> InteractionModel:
    from models.interaction import load_native

    return load_native(arg or "tiny", checkpoint=spec.checkpoint, device=spec.device, options=spec.native)


def _cascade(spec: ModelSpec, arg: str) -> InteractionModel:
    from models.cascade import load_cascade

    return load_cascade(arg)


def _moshi(spec: ModelSpec, arg: str) -> InteractionModel:
    from models.moshi import load_moshi

    model: InteractionModel = load_moshi(arg, checkpoint=spec.checkpoint, device=spec.device)
    return model


_FACTORIES: dict[str, Callable[[ModelSpec, str], InteractionModel]] = {
    "echo": _echo,
    "native": _native,
    "cascade": _cascade,
    "moshi": _moshi,
}

DEFAULT_MODEL = "cascade"


def available() -> list[str]:
    return sorted(_FACTORIES)


def load_model(name: str, checkpoint: str | None = None, device: str | None = None,
               native: NativeOptions | None = None) -> InteractionModel:
    """Build the model a name stands for: `family[:option]`. `native`: the native model's serving
    options (None: the defaults, environment overrides included)."""
    family, _, arg = name.partition(":")
    factory = _FACTORIES.get(family)
    if factory is None:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(available())}")
    return factory(ModelSpec(name, checkpoint, device, native), arg)
