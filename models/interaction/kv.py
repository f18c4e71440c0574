"""Per-session memory: the preallocated KV pool, its ring buffers, and the teacher-forced equivalent.

Memory is kept in whole micro-turns (tokens_per_tick tokens each). Every layer's store for one
session holds `sink + ring` micro-turns:

* sliding layers: sink = 0, ring = window_ticks. Micro-turn n lives at ring index n % ring and
  overwrites micro-turn n - ring, so a session runs for hours in fixed memory.
* global layers: the first `sink_ticks` micro-turns stay forever (the attention sink, as in
  StreamingLLM), later ones go round a ring of global_ticks - sink_ticks (micro-turn n >= sink at
  sink + (n - sink) % ring). Until the cap is reached a global layer sees the whole conversation;
  after it, the sink plus the most recent micro-turns. Nothing is ever reset silently and memory
  never grows.

While micro-turn n is processed its own keys are already stored, so a query sees: every held
micro-turn before n fully, and its own micro-turn causally. Keys are stored after RoPE with their
absolute positions, so evicting old ones changes nothing about the ones kept.

Both layouts fill a store from index 0 up: while micro-turn n is processed the held micro-turns are
exactly store indices 0 .. written(n) - 1, written(n) = min(n + 1, sink + ring). Attention reads only
that prefix (a view of the pool, no copy), so a micro-turn's cost grows with age until the store is
full (20 s for `tiny`'s global layer) and is flat from then on.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from models.interaction.config import InteractionConfig
from models.interaction.layers import TileKeys


@dataclass(frozen=True)
class Geometry:
    sink: int  # micro-turns kept from the start of the session
    ring: int  # most recent micro-turns kept, the current one included
    tokens: int  # tokens per micro-turn

    @property
    def ticks(self) -> int:
        return self.sink + self.ring

    def store_index(self, n: Tensor) -> Tensor:
        """Micro-turn n [B] -> where it is stored [B]."""
        return torch.where(n < self.sink, n, self.sink + torch.remainder(n - self.sink, self.ring))

    def store_index_of(self, n: int) -> int:
        """The same for one micro-turn, in plain integers (no tensor ops on the hot path)."""
        return n if n < self.sink else self.sink + (n - self.sink) % self.ring

    def written(self, n: int) -> int:
        """While micro-turn n is processed, store indices 0 .. written(n) - 1 hold micro-turns (see module doc)."""
        return min(n + 1, self.ticks)

    def held_ticks(self, n: Tensor) -> Tensor:
        """While micro-turn n [B] is processed: which micro-turn each store index holds [B, ticks], -1 = none."""
        j = torch.arange(self.sink, device=n.device)
        sink = torch.where(j[None] <= n[:, None], j[None], -1)  # [B, sink]
        p = torch.arange(self.ring, device=n.device)
        # newest m <= n stored at ring index p, i.e. with (m - sink) % ring == p
        m = n[:, None] - torch.remainder(n[:, None] - self.sink - p[None], self.ring)
        ring = torch.where(m >= self.sink, m, -1)  # [B, ring]
        return torch.cat([sink, ring], dim=1)

    def prefix_mask(self, n: int, device: torch.device) -> Tensor:
        """Mask [T, written(n)*T] over the written prefix: all of it, except the current micro-turn causally."""
        t, c = self.tokens, self.store_index_of(n)
        m = torch.ones(t, self.written(n) * t, dtype=torch.bool, device=device)
        m[:, c * t : (c + 1) * t] = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        return m

    def mask(self, n: Tensor) -> Tensor:
        """Attention mask [B, T, ticks*T] for micro-turn n [B]: held micro-turns fully, the current one causally."""
        held = self.held_ticks(n)  # [B, S]
        t = self.tokens
        causal = torch.ones(t, t, dtype=torch.bool, device=n.device).tril()  # [Tq, Tk]
        valid = (held >= 0)[:, None, :, None]  # [B, 1, S, 1]
        current = (held == n[:, None])[:, None, :, None]  # [B, 1, S, 1]
        m = valid & (~current | causal[None, :, None, :])  # [B, Tq, S, Tk]
        return m.reshape(len(n), t, self.ticks * t)


def geometries(cfg: InteractionConfig) -> list[Geometry]:
    t = cfg.tokens_per_tick
    return [
        Geometry(cfg.sink_ticks, cfg.global_ticks - cfg.sink_ticks, t)
        if cfg.layer_is_global(i)
        else Geometry(0, cfg.window_ticks, t)
        for i in range(cfg.n_layers)
    ]


class PoolFullError(RuntimeError):
    """Every KV slot is taken; the server should refuse the session (WebSocket close 1013)."""


class KVPool:
    """All sessions' KV memory, allocated once on the model's device; a session owns one slot (row)."""

    def __init__(self, cfg: InteractionConfig, n_slots: int, device: torch.device, dtype: torch.dtype) -> None:
        if n_slots < 1:
            raise ValueError(f"a KV pool needs at least one slot, got {n_slots}")
        self.geoms = geometries(cfg)
        self.n_slots = n_slots
        shape = (cfg.n_kv_heads, cfg.head_dim)
        # k[l], v[l]: [slots, sink+ring, T, Hkv, hd]
        self.k = [torch.zeros(n_slots, g.ticks, g.tokens, *shape, device=device, dtype=dtype) for g in self.geoms]
        self.v = [torch.zeros_like(x) for x in self.k]
        # The last k-1 normalised inputs of each layer's causal conv: [slots, layers, k-1, D]
        self.conv = torch.zeros(n_slots, cfg.n_layers, cfg.conv_kernel - 1, cfg.dim, device=device, dtype=dtype)
        self._free = list(range(n_slots - 1, -1, -1))
        self.n_reserved = 0  # slots taken for good as scratch (see reserve)

    @staticmethod
    def session_bytes(cfg: InteractionConfig, dtype: torch.dtype) -> int:
        """Bytes one session occupies; the same at every age."""
        item = torch.empty(0, dtype=dtype).element_size()
        kv = sum(2 * g.ticks * g.tokens * cfg.n_kv_heads * cfg.head_dim for g in geometries(cfg))
        return (kv + cfg.n_layers * (cfg.conv_kernel - 1) * cfg.dim) * item

    @property
    def in_use(self) -> int:
        return self.n_slots - self.n_reserved - len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise PoolFullError(
                f"all {self.n_slots} KV slots are in use; close a session or give the model a larger KV budget"
            )
        slot = self._free.pop()
        # Zero it: a new session must not see (or leak) the previous owner's keys.
        for x in (*self.k, *self.v):
            x[slot].zero_()
        self.conv[slot].zero_()
        return slot

    def reserve(self) -> int:
        """Take the highest free slot for good, as scratch space no session owns (the padding rows of
        a CUDA-graph bucket write there)."""
        if not self._free:
            raise PoolFullError("no KV slot left to reserve as scratch; give the model a larger KV budget")
        slot = max(self._free)
        self._free.remove(slot)
        self.n_reserved += 1
        return slot

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.n_slots:
            raise ValueError(f"KV slot {slot} is not allocated; was the session closed twice?")
        self._free.append(slot)


class StreamCache:
    """One batched micro-turn of live sessions against the pool: slots [B], their micro-turn index ticks [B]."""

    batchable = True  # B sessions' keys may be stacked for one batched attention call

    def __init__(self, pool: KVPool, slots: Sequence[int] | Tensor, ticks: Tensor) -> None:
        """slots may be a device tensor: then nothing here synchronises with the host until the per-tile
        path asks for plain integers (the stacked path never does, so a CUDA graph can capture it)."""
        self.pool = pool
        self.slot_t = slots if isinstance(slots, Tensor) else torch.tensor(list(slots), device=ticks.device)
        self.ticks = ticks
        self._ints: tuple[list[int], list[int]] | None = None
        self._masks: dict[tuple[Geometry, int, int], Tensor] = {}  # shared by sessions and layers alike

    def _slots_ticks(self) -> tuple[list[int], list[int]]:
        if self._ints is None:
            self._ints = [int(s) for s in self.slot_t.tolist()], [int(n) for n in self.ticks.tolist()]
        return self._ints

    def conv_prev(self, layer: int, h: Tensor) -> Tensor:
        k1 = self.pool.conv.shape[2]
        prev = self.pool.conv[self.slot_t, layer]  # [B, k-1, D] (a copy)
        self.pool.conv[self.slot_t, layer] = torch.cat([prev, h[:, -k1:]], dim=1)[:, -k1:]
        return prev

    def _store(self, layer: int, k: Tensor, v: Tensor) -> Geometry:
        g = self.pool.geoms[layer]
        idx = g.store_index(self.ticks)
        self.pool.k[layer][self.slot_t, idx] = k
        self.pool.v[layer][self.slot_t, idx] = v
        return g

    def _mask(self, g: Geometry, n: int) -> Tensor:
        key = (g, g.written(n), g.store_index_of(n))  # the mask depends on nothing else
        if key not in self._masks:
            self._masks[key] = g.prefix_mask(n, self.ticks.device)
        return self._masks[key]

    def exchange(self, layer: int, k: Tensor, v: Tensor) -> tuple[TileKeys, TileKeys, TileKeys]:
        g = self._store(layer, k, v)
        kp, vp = self.pool.k[layer], self.pool.v[layer]
        # Views of each slot's written prefix, [written*T, Hkv, hd]: attention reads the pool in place.
        slots, ticks = self._slots_ticks()
        ws = [g.written(n) for n in ticks]
        ks = [kp[s, :w].view(-1, *kp.shape[3:]) for s, w in zip(slots, ws, strict=True)]
        vs = [vp[s, :w].view(-1, *vp.shape[3:]) for s, w in zip(slots, ws, strict=True)]
        return ks, vs, [self._mask(g, n) for n in ticks]

    def exchange_stacked(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Like exchange, for one batched attention call: every slot's whole store stacked (a copy),
        [B, S*T, Hkv, hd] twice, and masks [B, T, S*T] that hide what was not written yet."""
        g = self._store(layer, k, v)
        kb = self.pool.k[layer][self.slot_t].flatten(1, 2)
        vb = self.pool.v[layer][self.slot_t].flatten(1, 2)
        return kb, vb, g.mask(self.ticks)


class _Gathered:
    """Lazily gathered per-micro-turn keys of a whole sequence (materialising all at once is N x K)."""

    def __init__(self, flat: Tensor, idx: Tensor, written: list[int]) -> None:
        self.flat, self.idx, self.written = flat, idx, written  # [N*T, Hkv, hd], [N, K], [N] (in tokens)

    def __len__(self) -> int:
        return int(self.idx.shape[0])

    def __getitem__(self, i: int) -> Tensor:  # -> [written*T, Hkv, hd], in store order
        return self.flat[self.idx[i, : self.written[i]]]


class _LazyMask:
    """Per-micro-turn masks of a whole sequence, built on demand ([N, T, K] at once is gigabytes)."""

    def __init__(self, geom: Geometry, n_ticks: int, device: torch.device) -> None:
        self.geom, self.n_ticks, self.device = geom, n_ticks, device

    def __len__(self) -> int:
        return self.n_ticks

    def __getitem__(self, i: int) -> Tensor:  # -> [T, written*T]
        return self.geom.prefix_mask(i, self.device)


class SequenceCache:
    """Teacher forcing: micro-turns 0..N-1 of one session as N tiles, no pool.

    It rebuilds, from positions alone, exactly what the pool would hold at every micro-turn (same key
    order, the same written prefix), so streaming and this must agree bit for bit in deterministic mode.
    """

    batchable = False  # N micro-turns' keys stacked would be N x the whole store: always per tile

    def __init__(self, cfg: InteractionConfig, n_ticks: int, device: torch.device) -> None:
        self.geoms = geometries(cfg)
        self.ticks = torch.arange(n_ticks, device=device)
        self.k1 = cfg.conv_kernel - 1

    def conv_prev(self, layer: int, h: Tensor) -> Tensor:
        first = torch.zeros_like(h[:1, : self.k1])
        return torch.cat([first, h[:-1, -self.k1 :]], dim=0)  # [N, k-1, D]: the previous tile's tail

    def exchange(self, layer: int, k: Tensor, v: Tensor) -> tuple[TileKeys, TileKeys, TileKeys]:
        g = self.geoms[layer]
        held = g.held_ticks(self.ticks)  # [N, S]
        t = torch.arange(g.tokens, device=k.device)
        index = (held.clamp(min=0)[:, :, None] * g.tokens + t).reshape(len(held), -1)  # [N, S*T]
        written = [g.written(n) * g.tokens for n in range(len(held))]
        kf, vf = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
        return _Gathered(kf, index, written), _Gathered(vf, index, written), _LazyMask(g, len(held), k.device)

    def exchange_stacked(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError("a teacher-forced sequence attends per tile (batchable is False)")


def flat_mask(cfg: InteractionConfig, n_ticks: int, layer: int, device: torch.device) -> Tensor:
    """The same visibility written as one [N*T, N*T] mask over the whole sequence (the reference path).

    Query in micro-turn n sees key in micro-turn m when: m == n and causal; or m < n and
    m >= n - ring + 1 (sliding); or, for global layers, additionally m < sink.
    """
    g = geometries(cfg)[layer]
    t = g.tokens
    tick = torch.arange(n_ticks * t, device=device) // t
    n, m = tick[:, None], tick[None, :]
    causal = torch.ones(n_ticks * t, n_ticks * t, dtype=torch.bool, device=device).tril()
    recent = (m <= n) & (m > n - g.ring)
    return causal & (recent | (m < g.sink))
