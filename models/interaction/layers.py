"""Transformer pieces: tile-wise linear, RMSNorm, RoPE, causal depthwise conv, SwiGLU, GQA attention block.

A *tile* is one session's micro-turn: [T, D] with T = tokens_per_tick. In deterministic mode a
tile's result must not depend on how many other tiles (sessions in the batch, micro-turns in a
teacher-forced sequence) are computed with it. Matrix products get that from rowblock.py (one product
over all rows in fixed 16-row blocks, verified on this machine); attention runs per tile over that
tile's own keys; everything else is elementwise or reduces within one row, which does not depend on
the row count.
"""

import contextlib
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.interaction.config import InteractionConfig
from models.interaction.rowblock import det_linear, linear


def tile_matmul(x: Tensor, w: Tensor, det: bool) -> Tensor:
    """x [B, ..., K] @ w [K, N] -> [B, ..., N]; batch-invariant (row-blocked) in deterministic mode."""
    if not det:
        return x @ w
    return det_linear(x, w.T)


class Lin(nn.Module):
    """Linear layer that honours the model's deterministic (batch-invariant) mode.

    `serve_weight`, when set (runtime.py does, for serving only), is a copy of the weight in another
    dtype (bf16) that the product runs in; inputs are cast to it and the result back. It is not a
    parameter: checkpoints, training and `weight` itself are untouched.
    """

    det: bool = False
    serve_weight: Tensor | None = None

    def __init__(self, d_in: int, d_out: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None

    def forward(self, x: Tensor) -> Tensor:  # [B, ..., d_in] -> [B, ..., d_out]
        w = self.serve_weight
        if w is None or torch.is_grad_enabled():
            return linear(x, self.weight, self.bias, self.det)
        b = self.bias.to(w.dtype) if self.bias is not None else None
        return linear(x.to(w.dtype), w, b, self.det).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(pos: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Absolute positions [B, T] -> cos, sin [B, T, 1, head_dim/2].

    Angles are computed in float64: positions reach 10^6 in long sessions and float32 would lose the
    fine frequencies' phase. The same position always yields the same bits, streaming or not.
    """
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=pos.device) / head_dim)
    ang = pos.to(torch.float64)[..., None] * inv  # [B, T, hd/2]
    return torch.cos(ang)[:, :, None, :].float(), torch.sin(ang)[:, :, None, :].float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # x [B, T, H, hd]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def causal_dwconv(h: Tensor, prev: Tensor, w: Tensor) -> Tensor:
    """Depthwise causal conv along tokens: h [B, L, D], prev [B, k-1, D] (the tokens before), w [k, D].

    Written as k shifted multiply-adds in a fixed order, so streaming tile by tile and one pass over
    the whole sequence produce the same bits.
    """
    k, length = w.shape[0], h.shape[1]
    padded = torch.cat([prev, h], dim=1)  # [B, k-1+L, D]
    out = padded[:, 0:length] * w[0]
    for j in range(1, k):
        out = out + padded[:, j : j + length] * w[j]
    return out


class FlatAttend(Protocol):
    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...

    def out_queries(self, layer: int, q: Tensor, k: Tensor, v: Tensor, first: int) -> Tensor: ...


class TileKeys(Protocol):
    """Per-tile keys or values: a list of pool views, or a lazy gather over a whole sequence."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Tensor: ...


class TileCache(Protocol):
    """What a block needs from the session memory; kv.py has the streaming and the sequence versions."""

    batchable: bool  # whether stacking every tile's keys for one attention call is sensible

    def conv_prev(self, layer: int, h: Tensor) -> Tensor:
        """h [B, T, D] (this tile's conv input) -> the k-1 inputs before it [B, k-1, D]; remembers h."""
        ...

    def exchange(self, layer: int, k: Tensor, v: Tensor) -> tuple[TileKeys, TileKeys, TileKeys]:
        """Store this tile's k, v [B, T, Hkv, hd]; return per tile: the keys and values written so far
        [K, Hkv, hd] (this tile included; K grows with age up to the store size) and the mask [T, K]
        (True = may attend)."""
        ...

    def exchange_stacked(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Like exchange, stacked for one batched call (only when `batchable`): keys and values
        [B, S, Hkv, hd] over the whole store, masks [B, T, S]."""
        ...


class Block(nn.Module):
    def __init__(self, cfg: InteractionConfig, index: int) -> None:
        super().__init__()
        self.index = index
        self.is_global = cfg.layer_is_global(index)
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.conv = nn.Parameter(torch.empty(cfg.conv_kernel, cfg.dim))
        self.wq = Lin(cfg.dim, cfg.n_heads * cfg.head_dim)
        self.wk = Lin(cfg.dim, cfg.n_kv_heads * cfg.head_dim)
        self.wv = Lin(cfg.dim, cfg.n_kv_heads * cfg.head_dim)
        self.wo = Lin(cfg.n_heads * cfg.head_dim, cfg.dim)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w1 = Lin(cfg.dim, cfg.ffn_hidden)
        self.w3 = Lin(cfg.dim, cfg.ffn_hidden)
        self.w2 = Lin(cfg.ffn_hidden, cfg.dim)
        # Batched attention gathers every session's whole store into one tensor (worth it on a GPU,
        # and the only way into a CUDA graph); the per-tile loop attends straight on the pool's
        # memory, written keys only (no copy, better on a CPU).
        self.batched_attention = False

    def _qkv(self, hn: Tensor, prev: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = hn.shape
        h = causal_dwconv(hn, prev, self.conv)  # [B, T, D]
        q = apply_rope(self.wq(h).view(b, t, self.n_heads, self.hd), cos, sin)  # [B, T, H, hd]
        k = apply_rope(self.wk(h).view(b, t, self.n_kv, self.hd), cos, sin)  # [B, T, Hkv, hd]
        v = self.wv(h).view(b, t, self.n_kv, self.hd)
        return q, k, v

    def _ffn(self, x: Tensor) -> Tensor:
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    def _attend_one(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """One tile: q [T, H, hd], k/v [K, Hkv, hd], mask [T, K] -> [T, H, hd].

        K is only what this tile's session has written (see kv.py), read in place from the pool; the
        grouped query heads share their K/V head inside the kernel (enable_gqa), so nothing is copied.
        """
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=mask[None, None],
            enable_gqa=True,
        )  # [1, H, T, hd]
        return o[0].transpose(0, 1)

    def _attend_stacked(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """All tiles in one call (GPU): q [B, T, H, hd], k/v [B, S, Hkv, hd], mask [B, T, S] -> [B, T, H, hd].

        Fixed shapes, no host sync (CUDA-graph capturable). The query heads sharing a K/V head are
        folded into the query length, as in _attend_one, so every backend can run it without copying
        K/V per head. In deterministic mode the memory-efficient kernel is required: it walks each
        query row's keys in one order whatever the batch (no split over keys chosen by batch size).
        """
        b, t, _, _ = q.shape
        rep = self.n_heads // self.n_kv
        qg = q.reshape(b, t, self.n_kv, rep, self.hd).permute(0, 2, 3, 1, 4).reshape(b, self.n_kv, rep * t, self.hd)
        det_gpu = self.wq.det and q.is_cuda
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]) if det_gpu else contextlib.nullcontext():
            o = F.scaled_dot_product_attention(
                qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask.repeat(1, rep, 1)[:, None]
            )  # [B, Hkv, rep*T, hd]
        return o.reshape(b, self.n_kv, rep, t, self.hd).permute(0, 3, 1, 2, 4).reshape(b, t, self.n_heads, self.hd)

    def forward_tiles(self, x: Tensor, pos_cs: tuple[Tensor, Tensor], cache: TileCache) -> Tensor:
        """x [B, T, D] one micro-turn per row (sessions, or micro-turns of one sequence) -> [B, T, D]."""
        b, t, _ = x.shape
        hn = self.attn_norm(x)  # [B, T, D]
        prev = cache.conv_prev(self.index, hn)  # [B, k-1, D]
        q, k, v = self._qkv(hn, prev, *pos_cs)
        if self.batched_attention and cache.batchable:
            kb, vb, mb = cache.exchange_stacked(self.index, k, v)  # [B, S, Hkv, hd] x2 (a copy), [B, T, S]
            o = self._attend_stacked(q, kb, vb, mb)
        else:
            ks, vs, mask = cache.exchange(self.index, k, v)
            o = torch.stack([self._attend_one(q[i], ks[i], vs[i], mask[i]) for i in range(b)])
        x = x + self.wo(o.reshape(b, t, -1))
        return self._ffn(x)

    def _fusable(self) -> bool:
        """Whether the flat path may run q/k/v and w1/w3 as one product each: only plain Lin layers
        outside deterministic mode (a LoRA wrapper adds its own update; det mode blocks rows its way)."""
        lins = (self.wq, self.wk, self.wv, self.w1, self.w3)
        return all(type(m) is Lin and not m.det and m.serve_weight is None for m in lins)

    def _qkv_fused(self, hn: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """_qkv for whole sequences (no previous tile) with one [D, (H + 2 Hkv) hd] product: one pass
        over the activations instead of three. Same maths; the sums may run in another order."""
        b, t, _ = hn.shape
        h = causal_dwconv(hn, hn.new_zeros(b, self.conv.shape[0] - 1, hn.shape[2]), self.conv)  # [B, T, D]
        w = torch.cat([self.wq.weight, self.wk.weight, self.wv.weight])  # [(H + 2 Hkv) hd, D]
        qkv = F.linear(h, w)
        nq, nk = self.n_heads * self.hd, self.n_kv * self.hd
        q = apply_rope(qkv[..., :nq].view(b, t, self.n_heads, self.hd), cos, sin)  # [B, T, H, hd]
        k = apply_rope(qkv[..., nq : nq + nk].view(b, t, self.n_kv, self.hd), cos, sin)  # [B, T, Hkv, hd]
        v = qkv[..., nq + nk :].view(b, t, self.n_kv, self.hd)
        return q, k, v

    def _ffn_fused(self, x: Tensor) -> Tensor:
        """_ffn with w1 and w3 as one product (one pass over the normalised activations)."""
        h = F.linear(self.ffn_norm(x), torch.cat([self.w1.weight, self.w3.weight]))  # [B, T, 2F]
        gate, up = h.chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)

    def forward_flat(self, x: Tensor, pos_cs: tuple[Tensor, Tensor], attend: "FlatAttend") -> Tensor:
        """Flat path: whole sequences as rows, x [B, L, D]; no cache. attend(layer, q, k, v) applies
        the streaming visibility rule over the whole sequence (models/interaction/flat.py).

        This is the training path: where the layers allow it the projections sharing an input run as
        one product each (fewer, larger GEMMs and one backward pass over the input instead of three).
        """
        b, length, dim = x.shape
        fused = self._fusable()
        if fused:
            q, k, v = self._qkv_fused(self.attn_norm(x), *pos_cs)
        else:
            prev = torch.zeros(b, self.conv.shape[0] - 1, dim, dtype=x.dtype, device=x.device)
            q, k, v = self._qkv(self.attn_norm(x), prev, *pos_cs)
        o = attend(self.index, q, k, v)  # [B, L, H, hd]
        x = x + self.wo(o.reshape(b, length, -1))
        return self._ffn_fused(x) if fused else self._ffn(x)

    def forward_flat_out(
        self, x: Tensor, pos_cs: tuple[Tensor, Tensor], attend: "FlatAttend", tokens: int, first: int
    ) -> Tensor:
        """forward_flat for the last layer, whose outputs only the heads read, and they read only the
        output slots first..T-1 of each micro-turn: x [B, N*T, D] -> [B, N*(T-first), D], exactly those
        rows of forward_flat. Keys and values (and the conv before them) still cover every token, but
        the queries, attention, wo and the FFN run on the output slots alone (13 of tiny's 41 tokens):
        the other rows' results would be thrown away, and in the last layer nothing attends to them.
        """
        b, length, dim = x.shape
        n, n_out = length // tokens, tokens - first

        def out_rows(y: Tensor) -> Tensor:  # [B, N*T, ...] -> [B, N*(T-first), ...]
            lead = y.shape[0]  # B, or 1 for the shared RoPE tables
            return y.reshape(lead, n, tokens, *y.shape[2:])[:, :, first:].reshape(lead, n * n_out, *y.shape[2:])

        hn = self.attn_norm(x)
        h = causal_dwconv(hn, hn.new_zeros(b, self.conv.shape[0] - 1, dim), self.conv)  # [B, L, D]
        cos, sin = pos_cs
        cos_o, sin_o = out_rows(cos), out_rows(sin)  # [1, N*(T-first), 1, hd/2]
        h_o = out_rows(h)
        if self._fusable():  # k and v as one product (see _qkv_fused)
            kv = F.linear(h, torch.cat([self.wk.weight, self.wv.weight]))
            k, v = kv.view(b, length, 2 * self.n_kv, self.hd).split(self.n_kv, dim=2)
        else:
            k, v = self.wk(h).view(b, length, self.n_kv, self.hd), self.wv(h).view(b, length, self.n_kv, self.hd)
        k = apply_rope(k, cos, sin)
        q = apply_rope(self.wq(h_o).view(b, n * n_out, self.n_heads, self.hd), cos_o, sin_o)
        o = attend.out_queries(self.index, q, k, v, first)  # [B, N*(T-first), H, hd]
        x = out_rows(x) + self.wo(o.reshape(b, n * n_out, -1))
        return self._ffn_fused(x) if self._fusable() else self._ffn(x)
