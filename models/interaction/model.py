"""The native interaction transformer: micro-turn tiles in, head outputs out. Pure math.

It knows nothing about sessions, sockets or clocks. Three ways to run the same weights:

* `forward_step(feats, pool, slots, ticks)`: one micro-turn for B live sessions against the KV pool;
* `forward_sequence(feats)`: micro-turns 0..N-1 of one session, teacher-forced, no pool (the
  baseline a server without persistent sessions pays every micro-turn, and the bit-exact check);
* `forward_reference(feats)`: the same sequence as one flat pass with a full [NT, NT] mask (an
  independent statement of the attention pattern, checked to a tolerance);
* `forward_batched(feats, n_ticks)`: B whole sequences at once, [B, N*T] tokens, the same mask run
  blockwise (flat.py): the training path.
"""

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from models.interaction.config import ACTIONS, BYTE_VOCAB, FRAMES_PER_TICK, NO_BYTE, InteractionConfig
from models.interaction.dmel import DMelEmbed
from models.interaction.flat import FlatAttention
from models.interaction.flow import FlowHead
from models.interaction.kv import KVPool, SequenceCache, StreamCache
from models.interaction.layers import Block, Lin, RMSNorm, TileCache, rope_tables
from models.interaction.video import HMLP, PATCH


@dataclass
class TickFeatures:
    """Everything one micro-turn feeds the model, for B rows (sessions or micro-turns)."""

    user_dmel: Tensor  # [B, 20, bins] int64 dMel levels of the user's audio
    self_dmel: Tensor  # [B, 20, bins] int64 dMel levels of what the model said last micro-turn
    video: Tensor  # [B, P, 40, 40, 3] float patches (zeros when absent)
    video_present: Tensor  # [B] bool: a new frame arrived this micro-turn
    typed: Tensor  # [B, typed_tokens] int64 bytes, NO_BYTE = empty
    background: Tensor  # [B, background_tokens] int64 bytes
    own_text: Tensor  # [B, text_tokens] int64 bytes the model wrote last micro-turn
    # [B, heard_tokens] int64 bytes of the words a recogniser heard (heard.py); None for a checkpoint
    # without the channel (heard_tokens = 0), where it is never read
    heard: Tensor | None = None

    @staticmethod
    def cat(parts: Sequence["TickFeatures"]) -> "TickFeatures":
        return TickFeatures(**{f.name: _cat([getattr(p, f.name) for p in parts])  # type: ignore[arg-type]
                               for f in fields(TickFeatures)})

    def rows(self, start: int, stop: int) -> "TickFeatures":
        return TickFeatures(**{f.name: _rows(getattr(self, f.name), start, stop)  # type: ignore[arg-type]
                               for f in fields(self)})

    def row(self, i: int) -> "TickFeatures":
        return self.rows(i, i + 1)

    def to(self, device: torch.device) -> "TickFeatures":
        return TickFeatures(**{f.name: None if (t := getattr(self, f.name)) is None  # type: ignore[arg-type]
                               else t.to(device) for f in fields(self)})


def _cat(parts: list[Tensor | None]) -> Tensor | None:
    if any(p is None for p in parts):  # all or none: a batch mixes no checkpoints
        assert all(p is None for p in parts), "TickFeatures.cat: heard given for some rows only"
        return None
    return torch.cat(parts)  # type: ignore[arg-type]


def _rows(t: Tensor | None, start: int, stop: int) -> Tensor | None:
    return None if t is None else t[start:stop]


@dataclass
class HeadOutputs:
    control: Tensor  # [B, len(ACTIONS) + 1] logits; the last one is "the user is speaking"
    text: Tensor  # [B, text_tokens, 257] byte logits (256 = no byte)
    transcript: Tensor  # [B, transcript_tokens, 257]
    audio_cond: Tensor  # [B, audio_out_tokens, dim] flow-head conditioning


class InteractionTransformer(nn.Module):
    def __init__(self, cfg: InteractionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.dmel = DMelEmbed(cfg)  # shared by the user's and the model's own audio
        self.video = HMLP(cfg)
        self.video_absent = nn.Parameter(torch.zeros(cfg.dim))
        self.bytes = nn.Embedding(BYTE_VOCAB, cfg.dim)  # typed, background and own text
        # The heard-words channel (heard.py), a table of its own: the same bytes mean something else
        # there. NO_BYTE embeds to zero, so a micro-turn with nothing heard is the audio alone.
        self.heard = nn.Embedding(BYTE_VOCAB, cfg.dim, padding_idx=NO_BYTE) if cfg.heard_tokens else None
        # Learned (modality, index-in-micro-turn) embedding: slot i always means the same thing.
        self.slot = nn.Parameter(torch.zeros(cfg.tokens_per_tick, cfg.dim))
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.control_head = Lin(cfg.dim, len(ACTIONS) + 1, bias=True)
        self.text_head = Lin(cfg.dim, BYTE_VOCAB, bias=True)
        self.transcript_head = Lin(cfg.dim, BYTE_VOCAB, bias=True)
        self.flow = FlowHead(cfg)
        self.deterministic = False

    # -- modes --------------------------------------------------------------------------------

    def set_deterministic(self, on: bool) -> None:
        """Batch-invariant mode: every matmul runs per tile with one fixed shape (see layers.py)."""
        self.deterministic = on
        for m in self.modules():
            if isinstance(m, Lin):
                m.det = on

    def set_batched_attention(self, on: bool) -> None:
        for b in self.blocks:
            assert isinstance(b, Block)
            b.batched_attention = on

    # -- pieces -------------------------------------------------------------------------------

    def embed(self, f: TickFeatures) -> Tensor:
        """features of B micro-turns -> [B, T, D] in slot order (config.py)."""
        cfg, b = self.cfg, f.user_dmel.shape[0]
        assert f.user_dmel.shape == (b, FRAMES_PER_TICK, cfg.dmel_bins), f.user_dmel.shape
        assert f.video.shape == (b, cfg.video_grid**2, PATCH, PATCH, 3), f.video.shape
        dtype = self.slot.dtype
        if bool(f.video_present.any()):
            vid = self.video(f.video.to(dtype))  # [B, P, D]
            vid = torch.where(f.video_present[:, None, None], vid, self.video_absent.to(dtype))
        else:  # no frame in any row: the same values without running the hMLP (most audio-only steps)
            vid = self.video_absent.to(dtype).expand(b, cfg.video_grid**2, cfg.dim)
        n_out = cfg.tokens_per_tick - cfg.slots["control"][0]
        user = self.dmel(f.user_dmel)
        if self.heard is not None:
            if f.heard is None:
                raise ValueError("this checkpoint reads heard words (heard_tokens > 0): give TickFeatures.heard")
            k = cfg.heard_tokens
            user = torch.cat([user[:, :k] + self.heard(f.heard).to(user.dtype), user[:, k:]], dim=1)
        parts = [
            user,
            self.dmel(f.self_dmel),
            vid,
            self.bytes(f.typed),
            self.bytes(f.background),
            self.bytes(f.own_text),
            torch.zeros(b, n_out, cfg.dim, dtype=dtype, device=vid.device),  # output slots: position only
        ]
        x = torch.cat(parts, dim=1) + self.slot  # [B, T, D]
        assert x.shape == (b, cfg.tokens_per_tick, cfg.dim), x.shape
        return x

    def heads(self, h: Tensor, first: int = 0) -> HeadOutputs:
        """Final hidden states [B, T - first, D] (slots first..T-1) -> head outputs, each read from its own slots."""
        s = self.cfg.slots

        def seg(name: str) -> Tensor:
            start, n = s[name]
            assert start >= first, (name, first)
            return h[:, start - first : start - first + n]

        return HeadOutputs(
            control=self.control_head(seg("control"))[:, 0],
            text=self.text_head(seg("text")),
            transcript=self.transcript_head(seg("transcript")),
            audio_cond=seg("audio_out"),
        )

    def _positions(self, ticks: Tensor) -> tuple[Tensor, Tensor]:
        t = self.cfg.tokens_per_tick
        pos = ticks[:, None] * t + torch.arange(t, device=ticks.device)  # [B, T] absolute positions
        return rope_tables(pos, self.cfg.head_dim, self.cfg.rope_theta)

    def _run_tiles(self, x: Tensor, ticks: Tensor, cache: TileCache) -> Tensor:
        cs = self._positions(ticks)
        for blk in self.blocks:
            x = blk.forward_tiles(x, cs, cache)  # type: ignore[operator]
        return self.norm(x)

    # -- the three entry points ---------------------------------------------------------------

    def forward_step(self, f: TickFeatures, pool: KVPool, slots: Sequence[int], ticks: Tensor) -> HeadOutputs:
        """One micro-turn of B sessions: their pool slots [B] and micro-turn indices ticks [B]."""
        x = self.embed(f)
        return self.heads(self._run_tiles(x, ticks, StreamCache(pool, slots, ticks)))

    def forward_sequence(self, f: TickFeatures) -> HeadOutputs:
        """Micro-turns 0..N-1 of one session (rows of f), teacher-forced, with tiles exactly as streamed."""
        x = self.embed(f)
        n = x.shape[0]
        ticks = torch.arange(n, device=x.device)
        return self.heads(self._run_tiles(x, ticks, SequenceCache(self.cfg, n, x.device)))

    def forward_reference(self, f: TickFeatures) -> HeadOutputs:
        """The same sequence as one row of N*T tokens with explicit full masks (no tiles, no cache)."""
        return self.forward_batched(f, f.user_dmel.shape[0], mode="masked")

    def forward_batched(self, f: TickFeatures, n_ticks: int, mode: str = "auto") -> HeadOutputs:
        """B whole sequences, rows of f episode-major ([B*N] micro-turns) -> head outputs for [B*N] rows.

        Every micro-turn of every sequence in one pass, exactly the streaming visibility; mode picks
        how the attention is run (flat.FlatAttention; "masked" = one full mask per layer).
        """
        x = self.embed(f)
        bn, t, d = x.shape
        if bn % n_ticks:
            raise ValueError(f"{bn} rows are not whole sequences of {n_ticks} micro-turns")
        b = bn // n_ticks
        ticks = torch.arange(n_ticks, device=x.device)
        cos, sin = self._positions(ticks)  # [N, T, 1, hd/2]: the same for every sequence
        cs = (cos.reshape(1, n_ticks * t, 1, -1), sin.reshape(1, n_ticks * t, 1, -1))
        attend = FlatAttention(self.cfg, n_ticks, x.device, mode)
        h = x.reshape(b, n_ticks * t, d)
        for blk in self.blocks[:-1]:
            h = blk.forward_flat(h, cs, attend)  # type: ignore[operator]
        # The heads read only the output slots, which are the last ones of a micro-turn (config.py), so
        # the last layer computes its rows for those alone (Block.forward_flat_out).
        first = self.cfg.slots["control"][0]
        h = self.blocks[-1].forward_flat_out(h, cs, attend, t, first)  # type: ignore[operator]
        return self.heads(self.norm(h).reshape(bn, t - first, d), first)


def init_weights(model: InteractionTransformer, seed: int) -> None:
    """Seeded random initialisation (no checkpoint): the same weights on every machine and start.

    Residual output projections are scaled down by depth (GPT-2); the control head is biased to
    "silent" so an untrained model stays quiet instead of speaking noise over the user.
    """
    g = torch.Generator().manual_seed(seed)
    depth_scale = (2 * model.cfg.n_layers) ** -0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if "norm" in owner.rpartition(".")[2]:  # RMSNorm / LayerNorm: identity at start
                p.fill_(1.0) if leaf == "weight" else p.zero_()
            elif leaf == "bias":
                p.zero_()
            elif leaf == "conv":
                # Start near identity: the last tap (the current token) 1, earlier taps small.
                w = torch.randn(p.shape, generator=g) * 0.02
                w[-1] += 1.0
                p.copy_(w)
            else:
                std = 0.02 * (depth_scale if leaf == "weight" and owner.endswith(("wo", "w2")) else 1.0)
                p.copy_(torch.randn(p.shape, generator=g) * std)
        model.control_head.bias[ACTIONS.index("silent")] = 4.0  # type: ignore[index]
        if model.heard is not None:
            model.heard.weight[NO_BYTE].zero_()  # nothing heard adds nothing (its padding row)
