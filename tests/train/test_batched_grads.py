"""The fast training path learns what the per-micro-turn loop would: same SFT loss, same gradients.

forward_batched (whole episodes in one flat pass, fused projections) against forward_sequence (the
tile-by-tile loop with the streaming cache), both in float32 on a small seeded model, through the real
sft_loss with every head judged (control, VAD, text, transcript, flow).
"""

import torch

from models.interaction.config import ACTIONS, BYTE_VOCAB, FRAMES_PER_TICK
from models.interaction.layers import Block
from models.interaction.model import HeadOutputs, InteractionTransformer, TickFeatures
from tests.models.test_interaction_core import random_features, small_net
from train.losses import Batch, LossWeights, sft_loss

N_TICKS = 9  # the small config's rings (sliding 2, global sink 1 + ring 3) wrap: every mask case runs
EPISODES = 2


def _batch(net: InteractionTransformer) -> Batch:
    cfg = net.cfg
    feats = TickFeatures.cat([random_features(cfg, N_TICKS, seed=10 + e) for e in range(EPISODES)])
    g = torch.Generator().manual_seed(7)
    rows = EPISODES * N_TICKS
    return Batch(
        feats=feats, n_ticks=N_TICKS,
        control=torch.randint(0, len(ACTIONS), (rows,), generator=g),
        user_speaking=torch.randint(0, 2, (rows,), generator=g).float(),
        text=torch.randint(0, BYTE_VOCAB, (rows, cfg.text_tokens), generator=g),
        transcript=torch.randint(0, BYTE_VOCAB, (rows, cfg.transcript_tokens), generator=g),
        mel=torch.randn(rows, FRAMES_PER_TICK, cfg.mel_bins, generator=g),
        mel_mask=torch.arange(rows) % 2 == 0,
    )


def _loop(net: InteractionTransformer, b: Batch) -> HeadOutputs:
    """Each episode through the per-micro-turn loop, rows stacked episode-major like the batch."""
    outs = [net.forward_sequence(b.feats.rows(e * N_TICKS, (e + 1) * N_TICKS)) for e in range(EPISODES)]
    return HeadOutputs(*(torch.cat([getattr(o, k) for o in outs])
                         for k in ("control", "text", "transcript", "audio_cond")))


def _loss_and_grads(net: InteractionTransformer, b: Batch, batched: bool) -> tuple[float, dict[str, torch.Tensor]]:
    net.zero_grad(set_to_none=True)
    out = net.forward_batched(b.feats, N_TICKS) if batched else _loop(net, b)
    loss, _ = sft_loss(out, b, net.flow, LossWeights(hold=2.0), torch.Generator().manual_seed(3))
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


def test_batched_loss_and_gradients_equal_the_loop() -> None:
    net = small_net().train()
    assert all(isinstance(b, Block) and b._fusable() for b in net.blocks)  # the fused path is what runs
    b = _batch(net)
    loss_b, grads_b = _loss_and_grads(net, b, batched=True)
    loss_l, grads_l = _loss_and_grads(net, b, batched=False)
    assert abs(loss_b - loss_l) <= 1e-5 * abs(loss_l), (loss_b, loss_l)
    assert grads_b.keys() == grads_l.keys()
    assert "blocks.0.wq.weight" in grads_b and "blocks.5.w3.weight" in grads_b
    for name, g in grads_l.items():
        assert float(g.abs().max()) > 0 or name.startswith("video"), f"{name}: no gradient in the loop"
        diff = float((grads_b[name] - g).abs().max())
        assert torch.allclose(grads_b[name], g, rtol=1e-4, atol=1e-6), f"{name}: max gradient difference {diff}"
