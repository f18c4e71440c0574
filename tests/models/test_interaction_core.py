"""The transformer core: streaming through the KV pool equals teacher-forced whole-sequence forwards.

A small config with tiny windows (sliding ring of 2 micro-turns, global sink 1 + ring 3) makes the
rings wrap several times within 12 micro-turns while the test stays fast.
"""

from collections.abc import Iterator

import pytest
import torch

from models.interaction import InteractionConfig, InteractionTransformer, KVPool, TickFeatures, init_weights
from models.interaction.config import BYTE_VOCAB, FRAMES_PER_TICK
from models.interaction.model import HeadOutputs

N_TICKS = 12


def small_cfg(**kw: object) -> InteractionConfig:
    args: dict[str, object] = dict(
        dim=32,
        n_layers=6,
        n_heads=4,
        n_kv_heads=2,
        window_ticks=2,
        sink_ticks=1,
        global_ticks=4,
        video_grid=1,
        hmlp_channels=(8, 8),
        dmel_embed=8,
        flow_hidden=32,
        griffin_lim_iters=2,
    )
    args.update(kw)
    return InteractionConfig(**args)  # type: ignore[arg-type]


def small_net(cfg: InteractionConfig | None = None, seed: int = 0) -> InteractionTransformer:
    net = InteractionTransformer(cfg or small_cfg())
    init_weights(net, seed)
    return net.eval()


def random_features(cfg: InteractionConfig, n: int, seed: int = 0) -> TickFeatures:
    g = torch.Generator().manual_seed(seed)
    p = cfg.video_grid**2

    def ints(hi: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, hi, shape, generator=g)

    return TickFeatures(
        user_dmel=ints(cfg.dmel_levels, n, FRAMES_PER_TICK, cfg.dmel_bins),
        self_dmel=ints(cfg.dmel_levels, n, FRAMES_PER_TICK, cfg.dmel_bins),
        video=torch.randn(n, p, 40, 40, 3, generator=g),
        video_present=torch.arange(n) % 3 == 0,
        typed=ints(BYTE_VOCAB, n, cfg.typed_tokens),
        background=ints(BYTE_VOCAB, n, cfg.background_tokens),
        own_text=ints(BYTE_VOCAB, n, cfg.text_tokens),
    )


def stream(net: InteractionTransformer, feats: TickFeatures) -> HeadOutputs:
    """Step micro-turn by micro-turn through a pool slot; stack the outputs like a sequence."""
    pool = KVPool(net.cfg, 2, torch.device("cpu"), torch.float32)
    pool.alloc()  # slot 0 taken by someone else: the session under test lives in slot 1
    slot = pool.alloc()
    outs = [net.forward_step(feats.row(n), pool, [slot], torch.tensor([n])) for n in range(len(feats.typed))]
    return HeadOutputs(
        *(torch.cat([getattr(o, k) for o in outs]) for k in ("control", "text", "transcript", "audio_cond"))
    )


def as_tuple(h: HeadOutputs) -> tuple[torch.Tensor, ...]:
    return h.control, h.text, h.transcript, h.audio_cond


@torch.inference_mode()
def test_streaming_equals_teacher_forced_sequence_bit_exact() -> None:
    net = small_net()
    net.set_deterministic(True)
    feats = random_features(net.cfg, N_TICKS)
    streamed = stream(net, feats)
    whole = net.forward_sequence(feats)
    for a, b in zip(as_tuple(streamed), as_tuple(whole), strict=True):
        assert a.shape == b.shape
        assert torch.equal(a, b), f"max diff {(a - b).abs().max().item()}"


@torch.inference_mode()
def test_streaming_matches_flat_reference_after_rings_wrap() -> None:
    """An independent statement of the attention pattern (one [NT, NT] mask, no ring, no tiles)."""
    net = small_net()
    feats = random_features(net.cfg, N_TICKS, seed=1)
    ref = net.forward_reference(feats)
    for mode in (True, False):
        net.set_deterministic(mode)
        for a, b in zip(as_tuple(stream(net, feats)), as_tuple(ref), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_window_really_forgets() -> None:
    """Guard against a vacuous equality: the window must change late outputs vs. a model that sees all."""
    feats = random_features(small_cfg(), N_TICKS, seed=2)
    short = small_net(small_cfg()).forward_reference(feats)
    long = small_net(small_cfg(window_ticks=N_TICKS, global_ticks=N_TICKS + 1)).forward_reference(feats)
    # Early micro-turns (all inside every window) agree; late ones differ.
    torch.testing.assert_close(short.audio_cond[:2], long.audio_cond[:2], rtol=1e-4, atol=1e-5)
    assert (short.audio_cond[-1] - long.audio_cond[-1]).abs().max() > 1e-3


@torch.inference_mode()
def test_batched_step_is_batch_invariant_in_deterministic_mode() -> None:
    """Core-level: a session's head outputs are bit-identical alone and in a batch of three ages."""
    net = small_net()
    net.set_deterministic(True)
    cfg = net.cfg
    fx, fy, fz = (random_features(cfg, N_TICKS, seed=s) for s in (3, 4, 5))
    alone_pool = KVPool(cfg, 1, torch.device("cpu"), torch.float32)
    a = alone_pool.alloc()
    pool = KVPool(cfg, 3, torch.device("cpu"), torch.float32)
    y, x, z = pool.alloc(), pool.alloc(), pool.alloc()
    for n in range(5):  # y is 5 micro-turns older than x
        net.forward_step(fy.row(n), pool, [y], torch.tensor([n]))
    for n in range(N_TICKS - 5):
        alone = net.forward_step(fx.row(n), alone_pool, [a], torch.tensor([n]))
        rows = [(fy, y, n + 5), (fx, x, n)] + ([(fz, z, n - 2)] if n >= 2 else [])
        feats = TickFeatures.cat([f.row(t) for f, _, t in rows])
        batched = net.forward_step(feats, pool, [s for _, s, _ in rows], torch.tensor([t for *_, t in rows]))
        for u, v in zip(as_tuple(alone), as_tuple(batched), strict=True):
            assert torch.equal(u[0], v[1]), f"micro-turn {n}: differs by {(u[0] - v[1]).abs().max().item()}"


def test_preset_sizes() -> None:
    """tiny is 5-20 M parameters, base about 300 M (counted on the meta device: nothing allocated)."""
    from models.interaction import preset

    counts = {}
    for name in ("tiny", "base"):
        with torch.device("meta"):
            net = InteractionTransformer(preset(name))
        counts[name] = sum(p.numel() for p in net.parameters())
    assert 5e6 <= counts["tiny"] <= 20e6, counts
    assert 250e6 <= counts["base"] <= 350e6, counts
    assert preset("tiny").tokens_per_tick == 41


def test_bad_config_is_explained() -> None:
    with pytest.raises(ValueError, match="divide"):
        small_cfg(n_heads=5)
    with pytest.raises(ValueError, match="old and their new names"):
        InteractionConfig.from_dict({**small_cfg().to_dict(), "window_turns": 3})


def test_a_config_saved_with_the_old_names_of_the_memory_sizes_reads_under_the_new_ones() -> None:
    """Older checkpoints (the shipped native-tiny among them) saved window_ticks, sink_ticks and global_ticks
    as `*_turns`."""
    cfg = small_cfg(window_ticks=3, sink_ticks=1, global_ticks=6)
    old = {k.replace("_ticks", "_turns"): v for k, v in cfg.to_dict().items()}
    assert "window_ticks" not in old and InteractionConfig.from_dict(old).same_as(cfg)
    assert set(InteractionConfig.from_dict(old).to_dict()) == set(cfg.to_dict())
    with pytest.raises(ValueError, match="unknown native preset"):
        from models.interaction import preset

        preset("huge")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """These models are tiny: one thread is fastest, and OpenMP spinning on a shared 2-core box is not."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
