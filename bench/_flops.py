"""FLOPs of one model step (torch's FLOP counter) and this machine's dense matmul peak, for bench.engine_scaling."""

import sys
import time
from collections.abc import Callable
from typing import Any

_registered = False


def _register_cpu_attention() -> None:
    """torch's counter knows the GPU attention kernels, not the CPU flash one; count it the same way
    (QK^T and PV: 4 * B * H * Lq * Lk * hd), grouped-query heads included."""
    global _registered
    if _registered:
        return
    import torch
    from torch.utils.flop_counter import register_flop_formula

    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is not None:

        @register_flop_formula(op)
        def _sdpa_cpu(query_shape: Any, key_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
            b, h, lq, d = query_shape
            return 4 * b * h * lq * key_shape[-2] * d

    _registered = True


def step_flops(fn: Callable[[], object]) -> float | None:
    """Run fn once and return the FLOPs torch saw (None when the model does not use torch)."""
    if "torch" not in sys.modules:
        fn()
        return None
    from torch.utils.flop_counter import FlopCounterMode

    _register_cpu_attention()
    with FlopCounterMode(display=False) as counter:
        fn()
    total = counter.get_total_flops()
    return float(total) if total else None


def matmul_peak_gflops(device: str = "cpu", repeats: int = 8) -> tuple[float, float | None]:
    """Best dense matmul rate with the current torch threads: fp32 2048^3 on a CPU, bf16 8192^3 on a
    GPU (the dtypes the native model serves in). Best, not median: the machine's ability.

    Returns (GFLOP/s of wall time, GFLOP/s per CPU-second of this process or None on a GPU). On a
    shared CPU the second is the steadier one: time other processes take the core does not count.
    """
    import torch

    cuda = device.startswith("cuda")
    n, dtype = (8192, torch.bfloat16) if cuda else (2048, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    wall = cpu = float("inf")
    for i in range(repeats + 2):
        if cuda:
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b, out=out)
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:  # two warm-up products
            wall = min(wall, time.perf_counter() - t0)
            cpu = min(cpu, time.process_time() - c0)
    flop = 2 * n**3 / 1e9
    return round(flop / wall, 1), (None if cuda else round(flop / cpu, 1))
