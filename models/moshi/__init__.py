"""Moshi-family weights (kyutai's Moshi, Hibiki and their fine-tunes) served batched: `--model moshi`.

`load_moshi(arg, checkpoint=..., device=...)` is what `duplex serve --model moshi[:key=value,...]
--checkpoint DIR` calls (options: models/moshi/options.py). It needs the optional `moshi` package
(`make setup-moshi`); importing this package does not import it before a model is loaded.
"""

from __future__ import annotations

import logging
from typing import Any

from models.moshi.options import CPU_SLOT_CAP, GPU_SLOT_CAP, MoshiOptions, parse_options

__all__ = ["MoshiOptions", "load_moshi", "parse_options", "slot_bytes", "slots_for_budget"]
log = logging.getLogger(__name__)


def _state_tensors(state: Any) -> list[Any]:
    """The tensors a streaming state holds, its KV ring buffer's included."""
    import torch

    found = []
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(getattr(value, "cache", None), torch.Tensor):  # moshi's RingKVCache
            found += [t for t in vars(value).values() if isinstance(t, torch.Tensor)]
    return found


def slot_bytes(lm: Any, mimi: Any, conditions: Any = None) -> int:
    """Bytes of streaming state one slot holds: measured by entering streaming for one slot (the LM's
    KV ring buffers and token cache, its depth transformer's, Mimi's encoder and decoder), not guessed.
    The modules must not be streaming already. On the meta device nothing is allocated. `conditions`:
    a conditioned LM's condition tensors for one slot."""
    from models.moshi.lmgen import SlotLMGen
    from models.moshi.sampling import Sampling

    total, seen = 0, set()
    gen = SlotLMGen(lm, Sampling(greedy=True), 1, conditions)
    for module in (gen, mimi, lm.depformer):
        if module is None:
            continue
        with module.streaming(1):
            for state in module.get_streaming_state().values():
                for t in _state_tensors(state):
                    if id(t) not in seen:
                        seen.add(id(t))
                        total += t.numel() * t.element_size()
            if module is gen:  # the LM itself streams under the generator (detached, so not listed)
                for state in lm.get_streaming_state().values():
                    for t in _state_tensors(state):
                        if id(t) not in seen:
                            seen.add(id(t))
                            total += t.numel() * t.element_size()
    return total


def slots_for_budget(per_slot: int, budget_bytes: int, wanted: int, cap: int) -> int:
    """`wanted` slots (0: as many as fit, at most `cap`), checked against the budget."""
    fit = budget_bytes // max(per_slot, 1)
    if fit < 1 or fit < wanted:
        raise ValueError(
            f"moshi: a budget of {budget_bytes / 2**20:.0f} MiB holds {fit} slot(s) of {per_slot / 2**20:.1f} MiB, "
            f"{'fewer than the ' + str(wanted) + ' asked for' if wanted else 'not even one'}; raise budget_mb= "
            "(--model moshi:budget_mb=...) or ask for fewer slots=")
    return wanted or int(min(fit, cap))


def load_moshi(arg: str = "", checkpoint: str | None = None, device: str | None = None) -> Any:
    """Load a checkpoint and build the serving model; every error names what to change."""
    from models.moshi.runtime import import_moshi

    opts = parse_options(arg)
    import_moshi(device)
    import torch

    from models.moshi.checkpoint import load
    from models.moshi.sampling import Sampling
    from models.moshi.serving import MoshiModel
    from models.threads import set_cpu_threads

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch sees no CUDA GPU; use --device cpu")
    if dev.type == "cpu":
        set_cpu_threads(opts.threads)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(
        opts.dtype, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    loaded = load(checkpoint or opts.checkpoint or None, dev, dtype)
    per_slot = slot_bytes(loaded.lm, loaded.mimi, loaded.conditions(1))
    if opts.budget_mb:
        budget = int(opts.budget_mb * 2**20)
    else:
        budget = int(torch.cuda.mem_get_info(dev)[0] * 0.85) if dev.type == "cuda" else 512 * 2**20
    n = slots_for_budget(per_slot, budget, opts.slots, GPU_SLOT_CAP if dev.type == "cuda" else CPU_SLOT_CAP)
    gen_cfg = loaded.lm_gen_config

    def pick(value: Any, key: str, default: Any) -> Any:
        return value if value is not None else gen_cfg.get(key, default)

    sampling = Sampling(greedy=opts.greedy, temp=pick(opts.temp, "temp", 0.8),
                        temp_text=pick(opts.temp_text, "temp_text", 0.7), top_k=pick(opts.top_k, "top_k", 250),
                        top_k_text=pick(opts.top_k_text, "top_k_text", 25))
    if gen_cfg.get("cfg_coef", 1.0) != 1.0:
        log.info("moshi: the checkpoint's cfg_coef %s (classifier-free guidance) is not served: 1.0",
                 gen_cfg["cfg_coef"])
    model = MoshiModel(loaded.lm, loaded.mimi, loaded.tokenizer, n, sampling, name="moshi", slot_bytes=per_slot,
                       conditions=loaded.conditions(n))
    params = sum(p.numel() for p in loaded.lm.parameters())
    log.info("%s %s: %.1f M LM parameters (%s) on %s, %d slots of %.1f MiB, %s", loaded.model_type, loaded.label,
             params / 1e6, str(dtype).removeprefix("torch."), dev, n, per_slot / 2**20,
             "greedy" if sampling.greedy else f"sampled per session (temp {sampling.temp}/{sampling.temp_text}, "
             f"top-k {sampling.top_k}/{sampling.top_k_text})")
    return model
