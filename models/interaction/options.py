"""How the native model is served (`duplex serve --native-*`): its options, checked where they are parsed.

Torch-free, so that the command line checks them without loading the model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

GRAPH_MODES = ("off", "eager", "cuda")
MATMUL_MODES = ("fp32", "bf16")
VOICE_MODES = ("auto", "flow", "piper")  # models/interaction/voice.py decides what auto means
QUERY_MODES = ("auto", "whisper", "heard")  # a hand-off's words (models/interaction/query.py)
TURN_CHECK_MODES = ("auto", "words", "off")  # the words' verdict on an onset (models/interaction/turn_check.py)
OVERLAP_CHECK_MODES = ("auto", "words", "off")  # the cues that hold a stop (models/interaction/overlap_check.py)


@dataclass(frozen=True)
class NativeOptions:
    """How the native model is served (`duplex serve --native-*`); ignored by the other models.

    The defaults come from `from_env()`: each environment variable overrides one built-in default,
    and a command-line option overrides both.
    """

    deterministic: bool = True  # batch-invariant mode (bit-identical alone or batched); False = fast
    threads: int = 0  # intra-op torch threads on a CPU; 0 = every core this process may use
    matmul: str = "fp32"  # what the transformer blocks' products run in: fp32 | bf16
    graphs: str | None = None  # bucketed step: off | eager | cuda; None = cuda on a GPU, off on a CPU
    graph_max_batch: int = 64  # largest bucket (bigger steps run as several)
    kv_budget_mb: float | None = None  # KV pool size; None = 512 MiB on a CPU, 85% of free GPU memory
    voice: str = "auto"  # flow = the model's own flow head; piper = its text spoken by Piper; auto = per metadata
    onset: float | None = None  # p(speak) a speech onset needs (models/interaction/onset.py); None = per metadata
    delegate: float | None = None  # p(delegate) a hand-off needs (the same module); None = per metadata
    query: str = "auto"  # a hand-off's words: whisper | heard (the recogniser's) | auto = whisper where installed
    turn_check: str = "auto"  # words = Whisper's verdict on the user's turn decides onsets with it | off | auto
    overlap_check: str = "auto"  # words = a stop under a backchannel is held | off | auto

    def __post_init__(self) -> None:
        if self.matmul not in MATMUL_MODES:
            raise ValueError(f"native matmul {self.matmul!r} (--native-matmul, DUPLEX_NATIVE_MATMUL) is not one "
                             f"of {', '.join(MATMUL_MODES)}")
        if self.graphs is not None and self.graphs not in GRAPH_MODES:
            raise ValueError(f"native graphs {self.graphs!r} (--native-graphs, DUPLEX_NATIVE_GRAPHS): use one of "
                             f"{', '.join(GRAPH_MODES)}")
        if self.threads < 0 or self.graph_max_batch < 1:
            raise ValueError("--torch-threads must be 0 (every core) or more and --graph-max-batch at least 1")
        if self.voice not in VOICE_MODES:
            raise ValueError(f"--voice {self.voice!r} (DUPLEX_NATIVE_VOICE): use one of {', '.join(VOICE_MODES)}")
        if self.query not in QUERY_MODES:
            raise ValueError(f"--native-query {self.query!r} (DUPLEX_NATIVE_QUERY): use one of "
                             f"{', '.join(QUERY_MODES)}")
        if self.turn_check not in TURN_CHECK_MODES:
            raise ValueError(f"--native-turn-check {self.turn_check!r} (DUPLEX_NATIVE_TURN_CHECK): use one of "
                             f"{', '.join(TURN_CHECK_MODES)}")
        if self.overlap_check not in OVERLAP_CHECK_MODES:
            raise ValueError(f"--native-overlap-check {self.overlap_check!r} (DUPLEX_NATIVE_OVERLAP_CHECK): use one "
                             f"of {', '.join(OVERLAP_CHECK_MODES)}")
        if self.onset is not None:
            check_onset(self.onset)
        if self.delegate is not None:
            check_delegate(self.delegate)
        if self.kv_budget_mb is not None and self.kv_budget_mb <= 0:
            raise ValueError(f"--kv-budget-mb must be positive, got {self.kv_budget_mb}")

    @classmethod
    def from_env(cls) -> NativeOptions:
        """The built-in defaults, each overridden by its environment variable when set; a variable that
        is not the number it stands for is a ValueError naming it."""
        env = os.environ
        return cls(deterministic=env.get("DUPLEX_NATIVE_DETERMINISTIC", "1") != "0",
                   threads=_env_number("DUPLEX_TORCH_THREADS", int) or 0,
                   matmul=env.get("DUPLEX_NATIVE_MATMUL") or "fp32",
                   graphs=env.get("DUPLEX_NATIVE_GRAPHS") or None,
                   graph_max_batch=_env_number("DUPLEX_GRAPH_MAX_BATCH", int) or 64,
                   kv_budget_mb=_env_number("DUPLEX_KV_BUDGET_MB", float),
                   voice=env.get("DUPLEX_NATIVE_VOICE") or "auto",
                   onset=_env_number("DUPLEX_NATIVE_ONSET", float),
                   delegate=_env_number("DUPLEX_NATIVE_DELEGATE", float),
                   query=env.get("DUPLEX_NATIVE_QUERY") or "auto",
                   turn_check=env.get("DUPLEX_NATIVE_TURN_CHECK") or "auto",
                   overlap_check=env.get("DUPLEX_NATIVE_OVERLAP_CHECK") or "auto")


def _check_probability(value: float, option: str, variable: str, zero: str) -> float:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{option} {value} ({variable}): a probability in [0, 1); 0 = {zero}")
    return value


def check_onset(value: float) -> float:
    """The p(speak) a speech onset needs (models/interaction/onset.py): a probability in [0, 1), 0 = greedy.
    Here, torch-free, so that options are checked where they are parsed."""
    return _check_probability(value, "--native-onset", "DUPLEX_NATIVE_ONSET", "greedy")


def check_delegate(value: float) -> float:
    """The p(delegate) a hand-off needs (models/interaction/onset.py): a probability in [0, 1), 0 = argmax."""
    return _check_probability(value, "--native-delegate", "DUPLEX_NATIVE_DELEGATE", "the argmax")


Number = TypeVar("Number", int, float)


def _env_number(name: str, kind: Callable[[str], Number]) -> Number | None:
    """The number an environment variable holds; None when it is unset or empty."""
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"${name}={raw!r} is not {what}; set it to one or unset it") from None
