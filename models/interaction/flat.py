"""Attention for the flat (training) path: whole sequences [B, N*T] with exactly the streaming mask.

The streaming step attends one micro-turn's queries to the session's stored keys; training wants all
N micro-turns of B episodes in one pass. Visibility is the same rule either way (kv.flat_mask): a
query in micro-turn n sees micro-turn m when m == n causally, or m < n within the layer's ring, or
m < sink on global layers. Three ways to run it, picked per layer by what the rule reduces to:

* `causal`: sink + ring cover the whole sequence (global layers of episodes <= global_ticks): plain
  token-causal SDPA, no mask tensor at all;
* `windowed`: sliding layers: queries in blocks of ring/4 micro-turns, each against its own block and
  the ones before it that the ring reaches (1.25 * ring micro-turns of keys) with the exact mask.
  Cost O(N * ring), not O(N^2);
* `masked`: anything else (a global cap shorter than the sequence): one [NT, NT] mask, O(N^2).
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from models.interaction.config import InteractionConfig
from models.interaction.kv import Geometry, flat_mask, geometries


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """q [B, L, H, hd], k/v [B, S, Hkv, hd] -> [B, L, H, hd] (GQA by enable_gqa)."""
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=causal, enable_gqa=True
    ).transpose(1, 2)


def _window_mask(g: Geometry, block: int, prev: int, device: torch.device) -> Tensor:
    """[prev+1, Bq*T, (prev+1)*Bq*T] masks for a query block of `block` micro-turns against the `prev`
    blocks before it and itself. Mask j is for query block j < prev (blocks that do not exist are
    masked out); the last one serves every later block."""
    t = g.tokens
    nq, nk = block * t, (prev + 1) * block * t
    qi = torch.arange(nq, device=device) + prev * block * t  # query token index within the key span
    ki = torch.arange(nk, device=device)
    n, m = qi[:, None] // t, ki[None, :] // t  # micro-turns, relative to the span's first one
    visible = (ki[None, :] <= qi[:, None]) & (m > n - g.ring)
    return torch.stack([visible & (m >= (prev - j) * block) for j in range(prev)] + [visible])


class FlatAttention:
    """Per-layer attention over whole sequences of n_ticks micro-turns (see the module docstring)."""

    def __init__(self, cfg: InteractionConfig, n_ticks: int, device: torch.device, mode: str = "auto") -> None:
        self.n_ticks, self.geoms = n_ticks, geometries(cfg)
        self.mode = mode
        self.cfg = cfg
        self.device = device
        self._masks: dict[tuple[str, int], Tensor] = {}

    def kind(self, layer: int) -> str:
        g = self.geoms[layer]
        if self.mode != "auto":
            return self.mode
        if g.sink + g.ring >= self.n_ticks:  # m < n - ring + 1 then implies m < sink: all visible
            return "causal"
        if g.sink == 0:
            return "windowed"
        return "masked"

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [B, N*T, H, hd], k/v [B, N*T, Hkv, hd] -> [B, N*T, H, hd]."""
        kind, g = self.kind(layer), self.geoms[layer]
        if kind == "causal":
            return _sdpa(q, k, v, None, True)
        if kind == "masked":
            key = ("masked", layer)
            if key not in self._masks:
                self._masks[key] = flat_mask(self.cfg, self.n_ticks, layer, self.device)
            return _sdpa(q, k, v, self._masks[key], False)
        return self._windowed(layer, g, q, k, v)

    def out_queries(self, layer: int, q: Tensor, k: Tensor, v: Tensor, first: int) -> Tensor:
        """Attention for the queries of slots first..T-1 of every micro-turn only (the last layer, whose
        other rows nothing reads): q [B, N*(T-first), H, hd], k/v [B, N*T, Hkv, hd] -> like q.

        The same visibility rule as __call__ (kv.flat_mask's rows for those queries), run in chunks of
        micro-turns, each against only the key range its queries can see: causal layers need keys up
        to the chunk's end (about half the full product over an episode), sliding ones the ring
        before it. The mask of a chunk is built from positions, O(chunk x keys), never [NT, NT].
        """
        g = self.geoms[layer]
        b, _, h, hd = q.shape
        t, n_out = g.tokens, g.tokens - first
        qs = q.view(b, self.n_ticks, n_out, h, hd)
        if self.mode == "masked":  # the reference: the rows of the one full mask, every key
            key = ("masked", layer)
            if key not in self._masks:
                self._masks[key] = flat_mask(self.cfg, self.n_ticks, layer, self.device)
            rows = self._masks[key].view(self.n_ticks, t, -1)[:, first:].reshape(self.n_ticks * n_out, -1)
            return _sdpa(q, k, v, rows, False)
        c = max(1, self.cfg.window_ticks // 4)  # micro-turns per query chunk
        outs = []
        for a in range(0, self.n_ticks, c):
            e = min(a + c, self.n_ticks)
            lo = 0 if g.sink else max(0, a - g.ring + 1)  # first micro-turn any query here may see
            ticks = torch.arange(a, e, device=q.device)
            qpos = (ticks[:, None] * t + torch.arange(first, t, device=q.device)).reshape(-1)
            kpos = torch.arange(lo * t, e * t, device=q.device)
            n, m = qpos[:, None] // t, kpos[None, :] // t
            visible = (kpos[None, :] <= qpos[:, None]) & ((m > n - g.ring) | (m < g.sink))
            outs.append(_sdpa(qs[:, a:e].reshape(b, -1, h, hd), k[:, lo * t : e * t], v[:, lo * t : e * t],
                              visible, False))
        return torch.cat(outs, dim=1)

    def _windowed(self, layer: int, g: Geometry, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Query blocks of ring/4 micro-turns, each against the blocks that can hold visible keys:
        1.25 x ring micro-turns of keys per query (ring/2-sized blocks would need 1.5 x, ring-sized 2 x).
        Smaller blocks waste less on masked keys but make more, smaller kernel calls: on a 2-core AVX2
        machine (tiny, ring 16, 100 micro-turns, batch 2) a sliding layer's forward+backward took 0.41 s
        with blocks of ring/2, 0.33 s with ring/4, 0.32 s with ring/8 and 0.38 s with single micro-turns."""
        b, length, h, hd = q.shape
        t = g.tokens
        w = max(1, g.ring // 4)  # query block, micro-turns
        prev = -(-(g.ring - 1) // w)  # earlier blocks a query block can see into
        nb = -(-self.n_ticks // w)
        pad = nb * w * t - length

        def blocks(x: Tensor) -> Tensor:  # [B, L, *, hd] -> [B, nb, W*T, *, hd]
            x = F.pad(x, (0, 0, 0, 0, 0, pad))
            return x.reshape(b, nb, w * t, *x.shape[2:])

        qb, kb, vb = blocks(q), blocks(k), blocks(v)

        def span(x: Tensor) -> Tensor:  # [B, nb, W*T, ...] -> [B, nb, (prev+1)*W*T, ...]: blocks j-prev..j
            z = torch.cat([torch.zeros_like(x[:, :1]).expand(-1, prev, *x.shape[2:]), x], dim=1)
            return torch.cat([z[:, i : i + nb] for i in range(prev + 1)], dim=2)

        k2, v2 = span(kb), span(vb)
        key = ("windowed", g.ring)
        if key not in self._masks:
            self._masks[key] = _window_mask(g, w, prev, q.device)
        m = self._masks[key]
        first = m[: min(prev, nb)]
        mask = torch.cat([first, m[prev:].expand(max(nb - prev, 0), -1, -1)])  # [nb, W*T, (prev+1)*W*T]
        o = _sdpa(
            qb.reshape(b * nb, w * t, h, hd),
            k2.reshape(b * nb, (prev + 1) * w * t, *k.shape[2:]),
            v2.reshape(b * nb, (prev + 1) * w * t, *v.shape[2:]),
            mask.repeat(b, 1, 1)[:, None],
            False,
        )
        return o.reshape(b, nb * w * t, h, hd)[:, :length]
