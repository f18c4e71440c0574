"""The training path (forward_batched: B whole episodes, blockwise exact mask) equals streaming."""

import pytest
import torch

from models.interaction.layers import Lin
from models.interaction.model import HeadOutputs, TickFeatures
from tests.models.test_interaction_core import as_tuple, random_features, small_cfg, small_net, stream


def _cat(parts: list[TickFeatures]) -> TickFeatures:
    return TickFeatures.cat(parts)


@pytest.mark.parametrize("n_ticks", [12, 13])  # a whole number of window blocks, and one over
@torch.inference_mode()
def test_batched_training_path_equals_streaming(n_ticks: int) -> None:
    """Three episodes in one pass vs each streamed micro-turn by micro-turn through a pool slot.

    Tolerance 1e-4 relative / 1e-5 absolute in float32: the blockwise attention sums in another
    order than the per-tile one, nothing else differs. The small config's rings (sliding 2, global
    sink 1 + ring 3) wrap several times, so every case of the mask is exercised: "windowed" on
    sliding layers and "masked" on the capped global layer.
    """
    net = small_net()
    eps = [random_features(net.cfg, n_ticks, seed=s) for s in range(3)]
    batched = net.forward_batched(_cat(eps), n_ticks)
    for i, ep in enumerate(eps):
        rows = slice(i * n_ticks, (i + 1) * n_ticks)
        streamed = stream(net, ep)
        for a, b in zip(as_tuple(streamed), as_tuple(batched), strict=True):
            torch.testing.assert_close(a, b[rows], rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_causal_shortcut_used_when_ring_covers_episode() -> None:
    """Global layers of episodes shorter than their cap run as plain causal attention; still exact."""
    net = small_net(small_cfg(global_ticks=20, sink_ticks=2))
    feats = random_features(net.cfg, 10, seed=5)
    from models.interaction.flat import FlatAttention

    kinds = {FlatAttention(net.cfg, 10, torch.device("cpu")).kind(i) for i in range(net.cfg.n_layers)}
    assert kinds == {"windowed", "causal"}
    got: HeadOutputs = net.forward_batched(feats, 10)
    for a, b in zip(as_tuple(stream(net, feats)), as_tuple(got), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_batched_path_has_gradients() -> None:
    net = small_net().train()
    feats = random_features(net.cfg, 6, seed=3)
    out = net.forward_batched(_cat([feats, feats]), 6)
    out.control.sum().backward()
    wq = net.blocks[0].wq
    assert isinstance(wq, Lin)
    assert wq.weight.grad is not None and float(wq.weight.grad.abs().sum()) > 0
