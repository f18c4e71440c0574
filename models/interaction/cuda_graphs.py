"""The transformer step in fixed batch-size buckets, replayed from CUDA graphs on a GPU.

On a GPU a micro-turn is hundreds of small kernels, and launched one by one from Python their launch
cost, not the maths, sets the step time. So the step runs in buckets (1, 2, 4, ... up to the pool
size): a batch of B sessions takes the smallest bucket >= B, the spare rows are padding that reads
and writes a scratch KV slot no session owns, and each bucket is captured once into a CUDA graph on
first use, then replayed with its static inputs refilled.

Capture needs fixed shapes and no host synchronisation, so this path attends with the stacked
whole-store call (kv.StreamCache.exchange_stacked + Block._attend_stacked), never the per-tile
written-prefix one whose shapes change with age. Batch invariance across buckets rests on the same
two legs as everywhere: row-blocked products checked by rowblock.py's probe (with cuBLAS's
reduced-precision split-K reductions switched off), and, in deterministic mode, the memory-efficient
attention kernel, which walks each query row's keys in one fixed order whatever the batch.

`capture=False` runs exactly the same bucketed, padded, stacked step without graphs: that is how the
CPU test suite checks this module's bookkeeping. The CUDA path itself was written without a GPU at
hand; tests/models/test_interaction_gpu.py checks it (skipped where torch sees no GPU).
"""

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from models.interaction.config import NO_BYTE
from models.interaction.kv import KVPool, StreamCache
from models.interaction.model import HeadOutputs, InteractionTransformer, TickFeatures

_HEADS = ("control", "text", "transcript", "audio_cond")


def buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... and max_batch itself: at most log2(max_batch) + 2 graphs, at most 2x padding."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


@dataclass
class _Bucket:
    feats: TickFeatures  # static inputs, [bucket, ...] each
    slots: Tensor  # [bucket] int64 on the device
    ticks: Tensor  # [bucket] int64 on the device
    heads: HeadOutputs | None = None  # static outputs (filled by capture, or by each eager run)
    graph: "torch.cuda.CUDAGraph | None" = None


class BucketedStep:
    """forward_step for B sessions as one fixed-shape, graph-capturable call (see module doc)."""

    def __init__(self, net: InteractionTransformer, pool: KVPool, max_batch: int, capture: bool) -> None:
        """max_batch: the largest bucket. Its stacked attention copies max_batch whole stores per layer,
        so it bounds activation memory; bigger steps run as several buckets."""
        self.net, self.pool = net, pool
        self.scratch = pool.reserve()  # padding rows write their keys here
        self.sizes = buckets(max_batch)
        self.capture = capture
        self._buckets: dict[int, _Bucket] = {}
        self._graph_pool: Any = None  # one memory pool shared by every bucket's graph (a torch handle)

    def reset(self) -> None:
        """Forget captured graphs (after switching deterministic mode or weights: kernels change)."""
        self._buckets.clear()

    def bucket_for(self, b: int) -> int:
        for size in self.sizes:
            if size >= b:
                return size
        raise ValueError(f"a step of {b} sessions exceeds the largest bucket ({self.sizes[-1]})")

    def _forward(self, bk: _Bucket) -> HeadOutputs:
        # What InteractionTransformer.forward_step does, with the slots as a device tensor (no host sync).
        net = self.net
        x = net.embed(bk.feats)
        return net.heads(net._run_tiles(x, bk.ticks, StreamCache(self.pool, bk.slots, bk.ticks)))

    def _new_bucket(self, size: int, like: TickFeatures) -> _Bucket:
        first = like.rows(0, 1)
        feats = TickFeatures(**{f.name: None if (t := getattr(first, f.name)) is None  # type: ignore[arg-type]
                                else t.expand(size, *t.shape[1:]).clone() for f in fields(TickFeatures)})
        dev = like.user_dmel.device
        slots = torch.full((size,), self.scratch, dtype=torch.long, device=dev)
        bk = _Bucket(feats, slots, torch.zeros(size, dtype=torch.long, device=dev))
        if self.capture:
            self._capture(bk)
        return bk

    def _capture(self, bk: _Bucket) -> None:
        """Warm up on a side stream (runs the product probes, picks kernels), then capture. Every row
        points at the scratch slot meanwhile, so no session's memory is touched."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(bk)
        torch.cuda.current_stream().wait_stream(side)
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            bk.heads = self._forward(bk)
        bk.graph = graph

    def _load(self, bk: _Bucket, feats: TickFeatures, slots: Sequence[int], ticks: Tensor) -> None:
        b = len(slots)
        for f in fields(TickFeatures):
            dst, src = getattr(bk.feats, f.name), getattr(feats, f.name)
            if dst is None or src is None:  # no heard-words channel
                continue
            dst[:b].copy_(src)
            if f.name in ("typed", "background", "own_text", "heard"):
                dst[b:] = NO_BYTE  # padding rows: empty text, silence, no video
            else:
                dst[b:] = 0
        bk.slots[:b].copy_(torch.tensor(list(slots), dtype=torch.long), non_blocking=True)
        bk.slots[b:] = self.scratch
        bk.ticks[:b].copy_(ticks)
        bk.ticks[b:] = 0

    def __call__(self, feats: TickFeatures, slots: Sequence[int], ticks: Tensor) -> HeadOutputs:
        b, top = len(slots), self.sizes[-1]
        if b > top:  # more sessions than the largest bucket: run it several times (still invariant)
            parts = [
                self(feats.rows(i, i + top), slots[i : i + top], ticks[i : i + top]) for i in range(0, b, top)
            ]
            return HeadOutputs(*(torch.cat([getattr(p, k) for p in parts]) for k in _HEADS))
        size = self.bucket_for(b)
        bk = self._buckets.get(size)
        if bk is None:
            bk = self._buckets[size] = self._new_bucket(size, feats)
        self._load(bk, feats, slots, ticks)
        if bk.graph is not None:
            bk.graph.replay()
        else:
            bk.heads = self._forward(bk)
        assert bk.heads is not None
        # Copies: the static outputs are overwritten by the next replay.
        return HeadOutputs(*(getattr(bk.heads, k)[:b].clone() for k in _HEADS))
