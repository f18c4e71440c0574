"""native:base on a CUDA GPU: batch invariance, constant memory, and the fast batched-attention path."""

import numpy as np
import pytest
import torch

from models.base import TickInput
from models.interaction import load_native

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _ticks(seed: int, n: int) -> list[TickInput]:
    rng = np.random.default_rng(seed)
    return [TickInput((rng.standard_normal(4800) * 0.1).astype(np.float32), 4800) for _ in range(n)]


def test_base_alone_equals_batched_and_memory_is_constant_on_gpu() -> None:
    model = load_native("base", device="cuda", kv_budget_mb=8 * 1024, deterministic=True)
    assert model.max_sessions is not None and model.max_sessions >= 4
    x_alone, x, y, z = (model.open(n) for n in ("x", "x", "y", "z"))
    for t in _ticks(1, 3):  # y is three micro-turns older
        model.step([(y, t)])
    mem = []
    for n, (tx, ty, tz) in enumerate(zip(_ticks(0, 6), _ticks(2, 6), _ticks(3, 6), strict=True)):
        (ref,) = model.step([(x_alone, tx)])
        got = model.step([(y, ty), (x, tx), (z, tz)])[1]
        assert np.array_equal(ref.audio, got.audio) and ref.text == got.text, f"micro-turn {n} differs"
        torch.cuda.synchronize()
        mem.append(torch.cuda.memory_allocated())
    assert len(set(mem[2:])) == 1, f"allocated memory changed while stepping: {mem}"
    # The fast mode batches attention across sessions; it must run and keep shapes.
    model.set_deterministic(False)
    outs = model.step([(y, _ticks(4, 1)[0]), (x, _ticks(5, 1)[0])])
    assert all(o.audio.shape == (4800,) for o in outs)
