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


def test_cuda_graph_replay_equals_the_same_step_run_eagerly() -> None:
    """Graph capture must not change a bit: the captured bucket and the eager bucketed step agree."""
    from models.interaction import NativeModel
    from models.interaction.checkpoint import build

    net = build("tiny", None).to(device="cuda", dtype=torch.bfloat16)
    dev = torch.device("cuda")
    graphed = NativeModel(net, "native:tiny", 8, dev, deterministic=True, graphs="cuda")
    eager = NativeModel(net, "native:tiny", 8, dev, deterministic=True, graphs="eager")
    gs = [graphed.open(f"s{i}") for i in range(3)]
    es = [eager.open(f"s{i}") for i in range(3)]
    for n, ticks in enumerate(zip(_ticks(10, 4), _ticks(11, 4), _ticks(12, 4), strict=True)):
        outs_g = graphed.step(list(zip(gs, ticks, strict=True)))
        outs_e = eager.step(list(zip(es, ticks, strict=True)))
        for a, b in zip(outs_g, outs_e, strict=True):
            assert np.array_equal(a.audio, b.audio) and a.text == b.text, f"micro-turn {n}: graph != eager"
    assert graphed.graphs is not None and all(bk.graph is not None for bk in graphed.graphs._buckets.values())


def test_bench_engine_on_cuda_reports_steps_by_batch_size() -> None:
    """The figures the issue asks for: ms per step by batch size and sessions inside the budget."""
    from bench.engine_scaling import main

    assert main(["--model", "native:tiny", "--device", "cuda", "--sessions", "1,8", "--steps", "3",
                 "--no-baseline", "--peak"]) == 0
