"""How a Moshi checkpoint is served: `--model moshi:key=value,...` (all optional).

    duplex serve --model moshi --checkpoint DIR
    duplex serve --model moshi:slots=4,greedy=true --checkpoint kyutai/moshiko-pytorch-bf16
    duplex serve --model moshi:checkpoint=DIR,temp=0.6

`checkpoint=` is the same as `--checkpoint` (which wins when both are given); a value must not contain
a comma.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

DTYPES = ("auto", "bf16", "fp32")
CPU_SLOT_CAP = 8  # slots when neither `slots` nor a budget says: every step computes every slot (serving.py)
GPU_SLOT_CAP = 64


@dataclass(frozen=True)
class MoshiOptions:
    checkpoint: str = ""  # a folder or a cached Hugging Face repo id (models/moshi/checkpoint.py)
    # Fixed slots (conversations held at once). Every frame steps all of them (idle ones masked out), so
    # more slots than users costs compute: 0 = as many as `budget_mb` holds, at most 8 on a CPU and 64 on
    # a GPU; N = exactly N (an error when the budget cannot hold them).
    slots: int = 0
    # Memory for the slots' streaming state (the LM's KV ring buffers, Mimi's, the token cache), in MiB.
    # 0 = 512 on a CPU, 85% of the GPU memory free once the weights are loaded.
    budget_mb: float = 0.0
    greedy: bool = False  # argmax tokens; otherwise sampled, from each session's own seeded generator
    temp: float | None = None  # audio temperature; None = the checkpoint's lm_gen_config, else moshi's 0.8
    temp_text: float | None = None  # text temperature (moshi: 0.7)
    top_k: int | None = None  # audio top-k (moshi: 250)
    top_k_text: int | None = None  # text top-k (moshi: 25)
    dtype: str = "auto"  # the LM's weights: auto = bf16 on a GPU, fp32 on a CPU; Mimi stays fp32
    threads: int = 0  # intra-op torch threads on a CPU; 0 = every core this process may use

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"moshi dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.slots < 0 or self.budget_mb < 0 or self.threads < 0:
            raise ValueError("moshi slots, budget_mb and threads must be >= 0 (0 = the default)")


def _convert(key: str, type_name: str, raw: str) -> object:
    try:
        if "bool" in type_name:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
        if "int" in type_name:
            return int(raw)
        if "float" in type_name:
            return float(raw)
    except ValueError:
        raise ValueError(f"moshi option {key}={raw!r}: expected {type_name}") from None
    return raw


def parse_options(opt: str) -> MoshiOptions:
    """`key=value,...` (the part of `--model moshi:...` after the colon) -> options."""
    names = {f.name: str(f.type) for f in fields(MoshiOptions)}
    values: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in opt.split(","))):
        key, eq, raw = part.partition("=")
        if not eq or key not in names:
            raise ValueError(f"moshi option {part!r}: use key=value with key one of {', '.join(names)}")
        values[key] = _convert(key, names[key], raw)
    return MoshiOptions(**values)  # type: ignore[arg-type]
