"""`--model moshi` on a CUDA GPU: moshi's CUDA graphs (the main step; the depth step when greedy) and the
per-session CUDA generators leave a session's tokens independent of who shares its slots."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("moshi") is None, reason="the moshi package: make setup-moshi"),
]


def _noise(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(4800) * 0.1).astype(np.float32) for _ in range(n)]


def _my_tokens(ckpt: Path, opts: str, others: bool) -> list[Any]:
    """Session "me" over 6 micro-turns in 3 slots, alone or beside two others (one skips a micro-turn)."""
    from models.base import TickInput
    from models.moshi import load_moshi

    model = load_moshi(opts, checkpoint=str(ckpt), device="cuda")
    me = model.open("me")
    mates = [model.open(f"mate-{i}") for i in range(2)] if others else []
    tokens: list[Any] = []

    def observe(st: Any, tok: Any) -> None:
        if st is me:
            tokens.append(tok)

    for k, audio in enumerate(_noise(0, 6)):
        batch = [(me, TickInput(audio, 4800))]
        batch += [(m, TickInput(_noise(10 + k + i, 1)[0], 4800)) for i, m in enumerate(mates) if k != 2 or i]
        model.step(batch, observe=observe)
    return tokens


@pytest.mark.parametrize("greedy", [True, False])
def test_a_session_is_the_same_alone_and_beside_others_on_gpu(tmp_path: Path, greedy: bool) -> None:
    from models.moshi import tiny

    ckpt = tiny.write(tmp_path / "tiny-moshi")
    opts = f"slots=3,dtype=fp32,greedy={str(greedy).lower()}"
    # The same 3 slots both times (the same shapes and kernels): only who else steps differs.
    alone, beside = _my_tokens(ckpt, opts, others=False), _my_tokens(ckpt, opts, others=True)
    assert alone == beside and any(t is not None for t in alone)
