"""Batch-invariant matrix products by fixed row blocks, checked on the machine that runs them.

Deterministic (batch-invariant) mode needs each row of `x @ w.T` to come out with the same bits
whatever other rows share the product. The old way ran one product per tile (per session), which is
invariant by construction but pays a small, badly blocked GEMM per session. A GEMM kernel reduces
each output element over K in an order set by its K blocking and its register micro-tile, not by how
many rows there are or where a row sits, as long as the rows come in whole blocks (a ragged tail of
rows may go through a different edge kernel). So here every product runs once over all rows, padded
to a multiple of ROW_BLOCK rows and cut into chunks of at most MAX_ROWS.

That property belongs to a BLAS library on a given CPU (or GPU), not to the maths, so it is checked,
not assumed: the first deterministic product of each (weight shape and layout, dtype, device, bias,
thread count) is probed by comparing rows multiplied inside products of several sizes and offsets
with the same rows multiplied in 16-row products of their own. Where any bit differs, that product
falls back to one product per tile and a warning says so. The probe costs a few milliseconds per
weight shape, once per process.
"""

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

ROW_BLOCK = 16  # rows per block: products always cover whole blocks
MAX_ROWS = 1024  # rows per product; bigger batches are cut into chunks of this size (a probed size)
# (rows, offset) of the probe products: whole blocks, rows landing at other positions in the kernel's tiles
_PROBES = ((ROW_BLOCK, 3), (3 * ROW_BLOCK, 5), (21 * ROW_BLOCK, 11), (MAX_ROWS, 7))

_verdicts: dict[tuple[object, ...], bool] = {}


def _key(w: Tensor, b: Tensor | None) -> tuple[object, ...]:
    return (tuple(w.shape), w.stride(), w.dtype, str(w.device), b is not None, torch.get_num_threads())


@torch.no_grad()
def _probe(w: Tensor, b: Tensor | None) -> bool:
    """Whether every row of F.linear(x, w, b) is the same whatever rows surround it (see module doc)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(MAX_ROWS + ROW_BLOCK, w.shape[1], generator=g).to(w.device, w.dtype)
    ref = torch.cat([F.linear(x[i : i + ROW_BLOCK], w, b) for i in range(0, len(x), ROW_BLOCK)])
    return all(torch.equal(F.linear(x[s : s + m], w, b), ref[s : s + m]) for m, s in _PROBES)


def rows_invariant(w: Tensor, b: Tensor | None = None) -> bool:
    """Probe once per product kind; the verdict is cached for the process."""
    key = _key(w, b)
    ok = _verdicts.get(key)
    if ok is None:
        ok = _verdicts[key] = _probe(w, b)
        if not ok:
            log.warning(
                "row-blocked products of shape %s (%s on %s) are not batch-invariant on this machine: "
                "deterministic mode falls back to one product per session for them (slower, still exact)",
                tuple(w.shape),
                w.dtype,
                w.device,
            )
    return ok


def det_linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """F.linear(x [B, ..., K], w [N, K], b [N]) -> [B, ..., N], each row's bits independent of the others.

    Row-blocked where the probe passed; otherwise one product per leading index (tile).
    """
    if not rows_invariant(w, b):
        return torch.stack([F.linear(x[i], w, b) for i in range(x.shape[0])])
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    n = rows.shape[0]
    pad = -n % ROW_BLOCK
    if pad:
        rows = F.pad(rows, (0, 0, 0, pad))  # [n + pad, K] zero rows: whole blocks only
    if rows.shape[0] <= MAX_ROWS:
        y = F.linear(rows, w, b)
    else:
        y = torch.cat([F.linear(rows[i : i + MAX_ROWS], w, b) for i in range(0, rows.shape[0], MAX_ROWS)])
    return y[:n].reshape(*lead, w.shape[0])


def linear(x: Tensor, w: Tensor, b: Tensor | None, det: bool) -> Tensor:
    """F.linear, batch-invariant in deterministic mode."""
    return det_linear(x, w, b) if det else F.linear(x, w, b)
