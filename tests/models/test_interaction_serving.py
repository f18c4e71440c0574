"""The serving hot path: row-blocked products, attention over written keys, bf16 products, the vocoder.

The bit-exact properties themselves (streaming == teacher-forced, alone == batched) are tested in
test_interaction_core.py and test_interaction_runtime.py; these check the pieces that make them fast.
"""

from functools import partial

import numpy as np
import pytest
import torch

from bench._flops import step_flops
from bench.native.vocoder_quality import measure as vocoder_quality
from models.interaction import NativeModel, TickFeatures
from models.interaction.kv import geometries
from models.interaction.model import HeadOutputs
from models.interaction.rowblock import ROW_BLOCK, det_linear, rows_invariant
from tests.models.test_interaction_core import one_thread, small_cfg, small_net  # noqa: F401 - fixture
from tests.models.test_interaction_runtime import same, speaking_net, ticks

CPU = torch.device("cpu")


@torch.inference_mode()
def test_row_blocked_products_equal_each_tile_multiplied_alone() -> None:
    """Whatever the probe decided on this machine (blocks, or one product per tile), a tile's rows
    come out of a batch of 1, 3, 16 or 40 tiles with the same bits."""
    g = torch.Generator().manual_seed(0)
    for k, n, bias in ((384, 1024, False), (64, 257, True), (80, 481, False)):
        w = torch.randn(n, k, generator=g)
        b = torch.randn(n, generator=g) if bias else None
        x = torch.randn(40, 41, k, generator=g)  # 40 tiles of 41 rows: ragged against 16-row blocks
        alone = [det_linear(x[i : i + 1], w, b)[0] for i in range(len(x))]
        for batch in (1, 3, 16, 40):
            y = det_linear(x[:batch], w, b)
            assert y.shape == (batch, 41, n)
            for i in range(batch):
                assert torch.equal(y[i], alone[i]), f"shape {k}x{n}: tile {i} of {batch} differs"
        assert isinstance(rows_invariant(w, b), bool)
    assert ROW_BLOCK == 16


def test_written_keys_are_a_prefix_of_the_store() -> None:
    """Attention reads store indices 0 .. written(n) - 1 only: they must be exactly the held ones."""
    for cfg in (small_cfg(), small_cfg(sink_ticks=2, global_ticks=7, window_ticks=3)):
        for g in geometries(cfg):
            for n in range(4 * g.ticks):
                held = g.held_ticks(torch.tensor([n]))[0]
                w = g.written(n)
                assert (held[:w] >= 0).all() and (held[w:] < 0).all(), (g, n, held)
                assert int(g.store_index(torch.tensor([n]))) == g.store_index_of(n) < w
                mask = g.prefix_mask(n, CPU)  # the current micro-turn causally, the rest fully
                assert mask.shape == (g.tokens, w * g.tokens)
                assert int(mask.sum()) == g.tokens * (w - 1) * g.tokens + g.tokens * (g.tokens + 1) // 2


@torch.inference_mode()
def test_step_cost_grows_with_age_until_the_store_is_full_then_stays_flat() -> None:
    """Counted in FLOPs (not timed): fresh sessions attend to little, old ones to the capped store."""
    model = NativeModel(small_net(), "native:test", 1, CPU, deterministic=True)
    steady = model.steady_age
    assert steady == max(g.ticks for g in geometries(model.cfg))
    warm = model.open("warm-up")  # the first step probes the row-blocked products (their FLOPs count too)
    model.step([(warm, ticks(0, 1)[0])])
    model.close(warm)
    flops: dict[int, float] = {}
    for age in (0, 2, steady, 5 * steady):
        s = model.open(f"age-{age}")
        if age:
            model.fast_forward(s, age)
        counted = step_flops(partial(model.step, [(s, ticks(0, 1)[0])]))
        assert counted is not None, "the native model runs on torch: its FLOPs are counted"
        flops[age] = counted
        model.close(s)
    assert flops[0] < flops[2] < flops[steady] == flops[5 * steady], flops


@torch.inference_mode()
def test_bf16_products_stay_bit_exact_where_it_matters_and_close_to_fp32() -> None:
    net = speaking_net()
    alone = NativeModel(net, "native:test", 1, CPU, deterministic=True, matmul="bf16")
    batch = NativeModel(net, "native:test", 2, CPU, deterministic=True, matmul="bf16")
    x_alone, y, x = alone.open("x"), batch.open("y"), batch.open("x")
    trace: list[tuple[TickFeatures, HeadOutputs]] = []
    for n, (tx, ty) in enumerate(zip(ticks(0, 5), ticks(1, 5), strict=True)):
        (ref,) = alone.step([(x_alone, tx)], observe=lambda _, f, h: trace.append((f, h)))
        assert same(ref, batch.step([(y, ty), (x, tx)])[1]), f"bf16: alone and batched differ at micro-turn {n}"
    feats = TickFeatures.cat([f for f, _ in trace])
    whole = net.forward_sequence(feats)  # still in bf16: the serving copies live in the modules
    streamed = torch.cat([h.audio_cond for _, h in trace])
    assert torch.equal(streamed, whole.audio_cond), "bf16: streaming and teacher-forced differ"
    alone.set_matmul("fp32")
    exact = net.forward_sequence(feats)
    rel = float((whole.audio_cond - exact.audio_cond).norm() / exact.audio_cond.norm())
    assert 0 < rel < 0.03, f"bf16 products moved the hidden states by {rel:.4f} (relative)"
    with pytest.raises(ValueError, match="DUPLEX_NATIVE_MATMUL"):
        alone.set_matmul("int4")


@torch.inference_mode()
def test_vocoder_inverts_a_speech_like_signal() -> None:
    """Griffin-Lim must converge: with 8 iterations the stream's spectrum is far closer to the input's
    than the zero-phase start (measured 0.85 -> 0.28 spectral convergence on this signal)."""
    none = vocoder_quality(sessions=2, iters=0, seconds=2.0, repeats=0)
    full = vocoder_quality(sessions=2, iters=8, seconds=2.0, repeats=0)
    assert full.spectral_convergence < 0.33 < 0.6 < none.spectral_convergence, (none, full)
    assert full.mel_db < 7.0, full
    assert np.isfinite(full.ms_per_call)


@torch.inference_mode()
def test_bucketed_step_the_cuda_graph_path_run_eagerly_keeps_batch_invariance() -> None:
    """The GPU step's bookkeeping on a CPU: batches padded to buckets, padding rows on a scratch slot,
    stacked whole-store attention. A session alone (bucket 1) and with two others (bucket 4) agree
    bit for bit, and the heads match the plain per-tile path up to rounding."""
    net = speaking_net()
    alone = NativeModel(net, "native:test", 2, CPU, deterministic=True, graphs="eager")
    batch = NativeModel(net, "native:test", 4, CPU, deterministic=True, graphs="eager")
    assert alone.max_sessions == 1 and batch.max_sessions == 3  # one slot each is scratch
    assert alone.graphs is not None and batch.graphs is not None
    assert batch.graphs.sizes == [1, 2, 3] and batch.graphs.bucket_for(3) == 3
    x_alone, y, x, z = alone.open("x"), batch.open("y"), batch.open("x"), batch.open("z")
    trace: list[tuple[TickFeatures, HeadOutputs]] = []
    for n, (tx, ty, tz) in enumerate(zip(ticks(0, 5), ticks(1, 5), ticks(2, 5), strict=True)):
        (ref,) = alone.step([(x_alone, tx)], observe=lambda _, f, h: trace.append((f, h)))
        rows = [(y, ty), (x, tx)] + ([(z, tz)] if n >= 2 else [])  # bucket 2, then bucket 3
        assert same(ref, batch.step(rows)[1]), f"bucketed: alone and batched differ at micro-turn {n}"
    feats = TickFeatures.cat([f for f, _ in trace])
    plain = net.forward_sequence(feats)  # the per-tile, written-keys-only path
    streamed = torch.cat([h.audio_cond for _, h in trace])
    torch.testing.assert_close(streamed, plain.audio_cond, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="DUPLEX_NATIVE_GRAPHS"):
        NativeModel(net, "native:test", 2, CPU, deterministic=True, graphs="cuda")
