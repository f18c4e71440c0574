"""Sizes of the native interaction model: one dataclass, named presets, derived sizes in __post_init__.

Every micro-turn (200 ms) is the same fixed run of token slots, the input segment first and the output
segment it conditions after it:

    input : user audio (+ heard words) | self audio | video patches | typed text | background text | own text (fed back)
    output: control | assistant text | user transcript | audio out

so that position n * tokens_per_tick + i is always slot i of micro-turn n and every step has one shape.
"""

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Audio frames are 10 ms (the dMel paper's hop); a 200 ms micro-turn always has 20 of them.
FRAMES_PER_TICK = 20
# Byte-level text: ids 0..255 are bytes, 256 means "no byte in this slot".
NO_BYTE = 256
BYTE_VOCAB = 257
# Control classes, in head order. The head has one extra logit: "the user is speaking" (the VAD).
ACTIONS = ("speak", "silent", "backchannel", "yield", "delegate")


@dataclass
class InteractionConfig:
    # --- transformer ---
    dim: int = 384
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 2  # grouped-query attention: n_heads / n_kv_heads query heads share a K/V head
    ffn_mult: float = 8 / 3  # SwiGLU hidden = ffn_mult * dim, rounded up to a multiple of 64
    global_every: int = 6  # every 6th layer attends globally: sliding:global = 5:1
    conv_kernel: int = 4  # short causal depthwise convolution before attention (tokens)
    rope_theta: float = 1_000_000.0  # large base: absolute positions reach ~10^6 in an hour-long session
    norm_eps: float = 1e-5
    # --- memory, in micro-turns (a micro-turn is tokens_per_tick tokens) ---
    window_ticks: int = 16  # sliding layers see the current micro-turn and the 15 before it (3.2 s)
    sink_ticks: int = 2  # global layers keep the first micro-turns forever (attention sink)...
    global_ticks: int = 100  # ...and are capped at this many micro-turns in all (sink + most recent: 20 s)
    # --- inputs ---
    audio_tokens: int = 4  # tokens per micro-turn for each audio stream; 20 dMel frames grouped 5 per token
    dmel_bins: int = 80  # log-mel bins at 16 kHz
    dmel_levels: int = 16  # quantisation levels per bin
    dmel_embed: int = 64  # size of each per-bin embedding (the frame embedding is their sum)
    video_grid: int = 2  # the newest frame is resized to (grid*40)^2 and cut into grid^2 patches of 40x40
    hmlp_channels: tuple[int, int] = (48, 96)  # hMLP stem widths after its 4x4 and 2x2 stages
    typed_tokens: int = 4  # bytes of typed user text per micro-turn (the rest waits in a queue)
    background_tokens: int = 8  # bytes of background-reasoner results per micro-turn
    # Words a streaming recogniser heard, bytes per micro-turn added onto the user-audio slots (heard.py);
    # 0 = audio only (no recogniser runs). An option of a checkpoint: it adds no slot, so positions and
    # the KV layout are the same either way.
    heard_tokens: int = 0
    # --- outputs ---
    text_tokens: int = 4  # assistant text bytes per micro-turn (also fed back as "own text" input)
    transcript_tokens: int = 4  # user-transcript bytes per micro-turn
    audio_out_tokens: int = 4  # flow-head conditioning slots; each generates 5 mel frames
    mel_bins: int = 80  # output mel bins (24 kHz, 0-12 kHz)
    flow_hidden: int = 512
    flow_steps: int = 4  # Euler steps of the rectified flow
    griffin_lim_iters: int = 8
    # --- derived (computed in __post_init__, not arguments) ---
    head_dim: int = field(init=False)
    ffn_hidden: int = field(init=False)
    tokens_per_tick: int = field(init=False)
    slots: dict[str, tuple[int, int]] = field(init=False)  # segment name -> (start, length)

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"dim {self.dim} must divide into n_heads {self.n_heads}, and n_heads into n_kv_heads "
                f"{self.n_kv_heads}; pick sizes that divide evenly"
            )
        if FRAMES_PER_TICK % self.audio_tokens or FRAMES_PER_TICK % self.audio_out_tokens:
            raise ValueError(f"audio_tokens and audio_out_tokens must divide {FRAMES_PER_TICK} frames")
        if not 0 <= self.sink_ticks < self.global_ticks:
            raise ValueError(f"need 0 <= sink_ticks ({self.sink_ticks}) < global_ticks ({self.global_ticks})")
        if not 0 <= self.heard_tokens <= self.audio_tokens:
            raise ValueError(f"heard_tokens ({self.heard_tokens}) must be 0..audio_tokens ({self.audio_tokens}): "
                             "its bytes are added onto the user-audio slots")
        if self.window_ticks < 1:
            raise ValueError(f"window_ticks must be >= 1, got {self.window_ticks}")
        self.head_dim = self.dim // self.n_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        self.ffn_hidden = -(-int(self.ffn_mult * self.dim) // 64) * 64
        order = [
            ("user_audio", self.audio_tokens),
            ("self_audio", self.audio_tokens),
            ("video", self.video_grid**2),
            ("typed", self.typed_tokens),
            ("background", self.background_tokens),
            ("own_text", self.text_tokens),
            ("control", 1),
            ("text", self.text_tokens),
            ("transcript", self.transcript_tokens),
            ("audio_out", self.audio_out_tokens),
        ]
        self.slots, start = {}, 0
        for name, n in order:
            self.slots[name] = (start, n)
            start += n
        self.tokens_per_tick = start

    def layer_is_global(self, i: int) -> bool:
        return (i + 1) % self.global_every == 0

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InteractionConfig":
        d = current_names(d)
        known = {f.name for f in fields(cls) if f.init}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)}; the checkpoint is from another version")
        if "hmlp_channels" in d:
            d["hmlp_channels"] = tuple(d["hmlp_channels"])
        return cls(**d)

    def same_as(self, other: "InteractionConfig") -> bool:
        return asdict(self) == asdict(other)


# Older checkpoints (the shipped native-tiny among them) saved the memory sizes under these names, from before
# the micro-turn was called a tick in the model's math too; they are read under today's names.
OLD_NAMES = {"window_turns": "window_ticks", "sink_turns": "sink_ticks", "global_turns": "global_ticks"}


def current_names(d: dict[str, Any]) -> dict[str, Any]:
    """A saved config (`to_dict`'s fields) with the fields older checkpoints named otherwise under today's names."""
    both = sorted(old for old, new in OLD_NAMES.items() if old in d and new in d)
    if both:
        raise ValueError(f"config fields {both} are given under their old and their new names; keep the new ones")
    return {OLD_NAMES.get(k, k): v for k, v in d.items()}


PRESETS: dict[str, InteractionConfig] = {
    # ~10 M parameters: steps in real time on 2 CPU cores.
    "tiny": InteractionConfig(),
    # ~300 M parameters: for a GPU. 77 tokens per micro-turn; sliding 6.4 s, global cap 60 s.
    "base": InteractionConfig(
        dim=1024,
        n_layers=24,
        n_heads=16,
        n_kv_heads=4,
        window_ticks=32,
        sink_ticks=4,
        global_ticks=300,
        video_grid=4,
        hmlp_channels=(96, 192),
        typed_tokens=8,
        background_tokens=16,
        text_tokens=8,
        transcript_tokens=8,
        dmel_embed=128,
        flow_hidden=1024,
    ),
}


def preset(name: str) -> InteractionConfig:
    try:
        return InteractionConfig.from_dict(PRESETS[name].to_dict())  # a fresh copy callers may edit
    except KeyError:
        raise ValueError(f"unknown native preset {name!r}; choose one of: {', '.join(sorted(PRESETS))}") from None
