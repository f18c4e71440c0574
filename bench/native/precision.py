"""python -m bench.native.precision: what running the native model's products in bf16 costs in output quality.

    python -m bench.native.precision --ticks 150 [--checkpoint FILE --preset tiny] --json

The same teacher-forced micro-turns (user audio from a speech-like signal, a typed sentence, the
model silent) go through `forward_sequence` twice, with the transformer blocks' products in fp32 and
in bf16 (DUPLEX_NATIVE_MATMUL=bf16), and the heads are compared:

* `*_rel`: relative L2 error of each head's logits (|| bf16 - fp32 || / || fp32 ||);
* `*_agree`: how often the decision (argmax) is the same: control action, user-speaking flag, every
  text and transcript byte;
* `mel_sc`: spectral convergence between the flow head's mel frames (same noise) from both, i.e.
  how different the audio the model would say is.

Without --checkpoint the weights are the seeded random ones, whose logits are near-uniform: argmax
agreement is then a harsh test (tiny logit errors flip near-ties), relative errors the fairer one.
"""

import argparse
import json
import sys
from dataclasses import asdict, dataclass

import torch

from bench.native.vocoder_quality import speech_like
from models.interaction import dmel
from models.interaction.checkpoint import build
from models.interaction.config import ACTIONS, FRAMES_PER_TICK, NO_BYTE
from models.interaction.flow import tick_noise
from models.interaction.model import HeadOutputs, InteractionTransformer, TickFeatures
from models.interaction.serving import MATMUL_DTYPES
from models.interaction.video import PATCH


@dataclass
class PrecisionReport:
    preset: str
    checkpoint: str | None
    matmul: str
    turns: int  # micro-turns (the JSON key stays "turns")
    control_rel: float
    control_agree: float
    vad_agree: float
    text_rel: float
    text_agree: float
    transcript_rel: float
    transcript_agree: float
    audio_cond_rel: float
    mel_sc: float


def features(net: InteractionTransformer, ticks: int) -> TickFeatures:
    cfg = net.cfg
    audio = speech_like(ticks * 0.2 + 0.1)
    fe = dmel.DMelFrontend(cfg.dmel_bins, cfg.dmel_levels, torch.device("cpu"))
    n = FRAMES_PER_TICK * dmel.HOP
    chunks = torch.stack([audio[i * n : i * n + dmel.CONTEXT + n] for i in range(ticks)])
    typed = torch.full((ticks, cfg.typed_tokens), NO_BYTE)
    text = b"what is the weather like in paris today?"
    for i in range(0, len(text), cfg.typed_tokens):  # typed from micro-turn 10 on, a few bytes a turn
        piece = text[i : i + cfg.typed_tokens]
        typed[10 + i // cfg.typed_tokens, : len(piece)] = torch.tensor(list(piece))
    nb = torch.full((ticks, 1), NO_BYTE)
    return TickFeatures(
        user_dmel=fe(chunks, det=True),
        self_dmel=torch.zeros(ticks, FRAMES_PER_TICK, cfg.dmel_bins, dtype=torch.long),
        video=torch.zeros(ticks, cfg.video_grid**2, PATCH, PATCH, 3),
        video_present=torch.zeros(ticks, dtype=torch.bool),
        typed=typed,
        background=nb.expand(ticks, cfg.background_tokens),
        own_text=nb.expand(ticks, cfg.text_tokens),
    )


def _set_matmul(net: InteractionTransformer, name: str) -> None:
    # The same switch NativeModel.set_matmul flips, without a KV pool around it.
    from models.interaction.layers import Lin

    dtype = MATMUL_DTYPES[name]
    for blk in net.blocks:
        for m in blk.modules():
            if isinstance(m, Lin):
                m.serve_weight = None if dtype is None else m.weight.detach().to(dtype)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return round(float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)), 5)


def _agree(a: torch.Tensor, b: torch.Tensor) -> float:
    return round(float((a == b).float().mean()), 4)


def run(preset: str, checkpoint: str | None, matmul: str, ticks: int) -> PrecisionReport:
    net = build(preset, checkpoint).eval()
    net.set_deterministic(True)
    feats = features(net, ticks)
    outs: dict[str, HeadOutputs] = {}
    mels: dict[str, torch.Tensor] = {}
    noise = tick_noise([7] * ticks, list(range(ticks)), (net.cfg.audio_out_tokens, net.flow.width), torch.device("cpu"))
    for name in ("fp32", matmul):
        _set_matmul(net, name)
        print(f"[bench.native.precision] {ticks} micro-turns with {name} products ...", file=sys.stderr, flush=True)
        outs[name] = h = net.forward_sequence(feats)
        mels[name] = net.flow.sample(h.audio_cond, noise)
    _set_matmul(net, "fp32")
    a, b = outs[matmul], outs["fp32"]
    n_act = len(ACTIONS)
    mel_a, mel_b = torch.exp(mels[matmul]), torch.exp(mels["fp32"])
    return PrecisionReport(
        preset,
        checkpoint,
        matmul,
        ticks,
        _rel(a.control, b.control),
        _agree(a.control[:, :n_act].argmax(-1), b.control[:, :n_act].argmax(-1)),
        _agree(a.control[:, n_act] > 0, b.control[:, n_act] > 0),
        _rel(a.text, b.text),
        _agree(a.text.argmax(-1), b.text.argmax(-1)),
        _rel(a.transcript, b.transcript),
        _agree(a.transcript.argmax(-1), b.transcript.argmax(-1)),
        _rel(a.audio_cond, b.audio_cond),
        _rel(mel_a, mel_b),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.native.precision", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--checkpoint", help="trained weights (.safetensors); default: seeded random weights")
    ap.add_argument("--matmul", default="bf16", choices=[m for m in MATMUL_DTYPES if m != "fp32"])
    ap.add_argument("--ticks", "--turns", type=int, default=150,
                    help="micro-turns (150 = 30 s: the global layer's ring wraps)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.ticks < 12:
        ap.error("--ticks must be >= 12 (the typed sentence starts at micro-turn 10)")
    with torch.inference_mode():
        r = run(args.preset, args.checkpoint, args.matmul, args.ticks)
    print(f"[bench.native.precision] {json.dumps(asdict(r))}", file=sys.stderr)
    if args.json:
        print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
