"""Model names accepted by `duplex serve --model` and the benchmarks.

Imports are lazy so that `echo` starts without torch and a missing optional dependency names itself.
"""

from collections.abc import Callable
from dataclasses import dataclass

from models.base import InteractionModel


@dataclass
class ModelSpec:
    """Everything a model name and its options resolve to."""

    name: str  # e.g. "echo", "echo:2", "native:tiny", "cascade"
    checkpoint: str | None = None
    device: str | None = None


def _echo(spec: ModelSpec, arg: str) -> InteractionModel:
    from models.echo import EchoModel

    try:
        delay = int(arg) if arg else 1
    except ValueError:
        raise ValueError(f"echo takes a delay in micro-turns, e.g. 'echo:2'; got {spec.name!r}") from None
    return EchoModel(delay=delay)


def _native(spec: ModelSpec, arg: str) -> InteractionModel:
    from models.interaction import load_native

    return load_native(arg or "tiny", checkpoint=spec.checkpoint, device=spec.device)


def _cascade(spec: ModelSpec, arg: str) -> InteractionModel:
    from models.cascade import load_cascade

    return load_cascade(arg)


_FACTORIES: dict[str, Callable[[ModelSpec, str], InteractionModel]] = {
    "echo": _echo,
    "native": _native,
    "cascade": _cascade,
}

DEFAULT_MODEL = "cascade"


def available() -> list[str]:
    return sorted(_FACTORIES)


def load_model(name: str, checkpoint: str | None = None, device: str | None = None) -> InteractionModel:
    """Build the model a name stands for: `family[:option]`."""
    family, _, arg = name.partition(":")
    factory = _FACTORIES.get(family)
    if factory is None:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(available())}")
    return factory(ModelSpec(name, checkpoint, device), arg)
