"""Train the overlap probe (models/speech/overlap.py): interruption or backchannel, early in the overlap.

    python -m train.overlap                      # synthesise, cache features, cross-validate, write the weights
    python -m train.overlap --early-ms 200 --seed 0 --out models/speech/weights/overlap-probe.npz

Each example is one utterance said over the assistant: a backchannel (train/_texts.py
OVERLAP_BACKCHANNELS) or the start of an interruption (OVERLAP_INTERRUPTIONS, sentences disjoint from
the benchmark's), spoken by Piper joe or an espeak-ng voice at a random rate, pitch, level, start
phase within a micro-turn and noise floor. It is streamed through the cascade's own front end in
200 ms micro-turns (24 -> 16 kHz, Silero VAD, the turn policy's counters with the assistant talking),
and the probe's features are taken exactly where the cascade takes them: at the end of the first
micro-turn in which the overlap holds `--early-ms` of speech. Utterances that never get there are
never judged early, and are left out.

Reports accuracy with the voices held out (5 folds: a voice is never in its own fold's training data)
and with the texts held out; writes the probe fitted on everything, with how it was made in its metadata.
Features are cached (`--cache`): a rerun with the same settings only refits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from models.cascade.options import CascadeOptions
from models.cascade.policy import TurnPolicy, TurnState
from models.speech.asr import ASR_RATE, WhisperTranscriber
from models.speech.overlap import DEFAULT_WEIGHTS, ProbeWeights, clip_for, features, onset_index
from streaming.resample import StreamResampler, resample
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, Audio
from train._texts import OVERLAP_BACKCHANNELS, OVERLAP_INTERRUPTIONS

Features = npt.NDArray[np.float32]


@dataclass
class Example:
    label: int  # 1 = interruption, 0 = backchannel
    text: str
    voice: str
    x: Features


def render(text: str, voice: str, rng: random.Random) -> Audio:
    """One utterance in 24 kHz micro-turn audio: silence at a random phase, the speech at a random
    level, a tail of silence, a noise floor."""
    from models.speech.tts import synthesize

    audio, sr = synthesize(text, voice, rate=rng.uniform(0.8, 1.25), pitch=rng.uniform(0.8, 1.25))
    speech = resample(audio, sr, SAMPLE_RATE)
    speech = speech / (float(np.sqrt(np.mean(speech**2))) + 1e-9) * rng.uniform(0.02, 0.15)
    lead = np.zeros(round(rng.uniform(0.4, 0.6) * SAMPLE_RATE), dtype=np.float32)
    x = np.concatenate([lead, speech, np.zeros(SAMPLE_RATE, dtype=np.float32)])
    noise = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(len(x)).astype(np.float32)
    x = x + rng.uniform(0.0002, 0.003) * noise
    return np.clip(x, -1.0, 1.0).astype(np.float32)


def judged_clip(x: Audio, early_ms: int) -> Audio | None:
    """Stream `x` as the cascade does, the assistant talking; the probe's clip at the first micro-turn
    whose overlap holds `early_ms` of speech (None: the utterance never gets there)."""
    from models.speech.vad import shared_vad

    vad = shared_vad()
    policy, state = TurnPolicy(CascadeOptions()), TurnState()
    mic, stream = StreamResampler(SAMPLE_RATE, ASR_RATE), vad.open(ASR_RATE)
    heard: list[Audio] = []
    consumed = 0
    for i in range(0, len(x) - TICK_SAMPLES + 1, TICK_SAMPLES):
        clean = mic.process(x[i : i + TICK_SAMPLES])
        heard.append(clean)
        consumed += len(clean)
        policy.observe(state, vad.step([stream], [clean])[0], assistant_busy=True)
        if state.turn and state.turn_speech_ms >= early_ms:
            audio = np.concatenate(heard)
            return clip_for(audio, onset_index(len(audio), consumed, state.turn_started_ms))
    return None


def build(args: argparse.Namespace, whisper: WhisperTranscriber) -> list[Example]:
    from models.speech.tts import list_voices

    voices = list_voices()
    if len(voices) < 3:
        sys.exit(f"train.overlap needs several voices (Piper joe and espeak-ng), found {voices}; "
                 "install espeak-ng (apt-get install espeak-ng)")
    rng = random.Random(args.seed)
    jobs = [(label, text, voice) for label, texts in ((0, OVERLAP_BACKCHANNELS), (1, OVERLAP_INTERRUPTIONS))
            for text in texts for voice in voices for _ in range(args.variants)]
    out: list[Example] = []
    t0 = time.monotonic()
    for n, (label, text, voice) in enumerate(jobs, 1):
        clip = judged_clip(render(text, voice, rng), args.early_ms)
        if clip is not None:
            out.append(Example(label, text, voice, features(whisper, clip)))
        if n % 100 == 0 or n == len(jobs):
            rate = n / (time.monotonic() - t0)
            print(f"  features {n}/{len(jobs)} ({len(out)} reach {args.early_ms} ms), "
                  f"{rate:.1f}/s, ETA {(len(jobs) - n) / rate:.0f} s", flush=True)
    return out


def fit(x: Features, y: npt.NDArray[np.float32], l2: float) -> tuple[Features, Features, Features, float]:
    """Standardise, then a class-balanced logistic regression (L-BFGS). Returns (mean, std, w, b)."""
    import torch

    mean, std = x.mean(0), x.std(0) + 1e-3
    z = torch.tensor((x - mean) / std)
    t = torch.tensor(y)
    pos = float(t.mean())
    weight = torch.where(t > 0.5, 0.5 / max(pos, 1e-6), 0.5 / max(1 - pos, 1e-6))
    lin = torch.nn.Linear(z.shape[1], 1)
    torch.nn.init.zeros_(lin.weight)
    torch.nn.init.zeros_(lin.bias)
    opt = torch.optim.LBFGS(lin.parameters(), max_iter=300, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        bce = torch.nn.functional.binary_cross_entropy_with_logits(lin(z)[:, 0], t, weight=weight)
        loss = bce + l2 * lin.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    w = lin.weight.detach().numpy()[0].astype(np.float32)
    return mean.astype(np.float32), std.astype(np.float32), w, float(lin.bias.detach()[0])


def cross_validate(data: list[Example], key: str, l2: float, threshold: float, folds: int = 5) -> dict[str, float]:
    """Held-out rates with the groups of `key` (voice or text) split into folds."""
    groups = sorted({getattr(e, key) for e in data})
    random.Random(0).shuffle(groups)
    fold_of = {g: i % folds for i, g in enumerate(groups)}
    x = np.stack([e.x for e in data])
    y = np.array([e.label for e in data], dtype=np.float32)
    p = np.zeros(len(data))
    for f in range(folds):
        test = np.array([fold_of[getattr(e, key)] == f for e in data])
        mean, std, w, b = fit(x[~test], y[~test], l2)
        p[test] = 1 / (1 + np.exp(-(((x[test] - mean) / std) @ w + b)))
    said = p >= threshold
    return {
        "accuracy": float(np.mean(said == (y > 0.5))),
        "interruptions_caught": float(np.mean(said[y > 0.5])),  # paused early
        "backchannels_paused": float(np.mean(said[y < 0.5])),  # paused although only a backchannel
    }


def commit() -> str:
    try:
        git = ["git", "describe", "--always", "--dirty"]
        return subprocess.run(git, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.overlap", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--early-ms", type=int, default=CascadeOptions().barge_in_early_ms,
                   help="overlap speech at which the probe is asked (the cascade's barge_in_early_ms)")
    p.add_argument("--variants", type=int, default=2, help="renderings of each text by each voice")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--l2", type=float, default=1e-2, help="weight decay of the logistic layer")
    p.add_argument("--threshold", type=float, default=CascadeOptions().barge_in_early_p,
                   help="P(interruption) the rates are reported at (the cascade's barge_in_early_p)")
    p.add_argument("--cache", type=Path, default=Path("data/overlap"), help="feature cache folder")
    p.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS, help="weights file to write")
    args = p.parse_args(argv)

    whisper = WhisperTranscriber()
    key = hashlib.sha256(json.dumps([args.early_ms, args.variants, args.seed, OVERLAP_BACKCHANNELS,
                                     OVERLAP_INTERRUPTIONS]).encode()).hexdigest()[:12]
    cache = args.cache / f"features-{key}.npz"
    if cache.exists():
        with np.load(cache, allow_pickle=False) as z:
            data = [Example(int(lab), str(t), str(v), x) for lab, t, v, x in zip(z["y"], z["text"], z["voice"], z["x"],
                                                                                  strict=True)]
        print(f"features from {cache} ({len(data)} examples)")
    else:
        print(f"synthesising and streaming overlaps (seed {args.seed}) ...", flush=True)
        data = build(args, whisper)
        args.cache.mkdir(parents=True, exist_ok=True)
        np.savez(cache, x=np.stack([e.x for e in data]), y=np.array([e.label for e in data]),
                 text=np.array([e.text for e in data]), voice=np.array([e.voice for e in data]))
    n_int = sum(e.label for e in data)
    print(f"{len(data)} examples reach {args.early_ms} ms: {n_int} interruptions, {len(data) - n_int} backchannels")
    by_voice = cross_validate(data, "voice", args.l2, args.threshold)
    by_text = cross_validate(data, "text", args.l2, args.threshold)
    for name, r in (("voices held out", by_voice), ("texts held out", by_text)):
        print(f"{name}: accuracy {r['accuracy']:.3f}, interruptions caught {r['interruptions_caught']:.3f}, "
              f"backchannels paused {r['backchannels_paused']:.3f} (at P >= {args.threshold})")
    x = np.stack([e.x for e in data])
    y = np.array([e.label for e in data], dtype=np.float32)
    mean, std, w, b = fit(x, y, args.l2)
    meta = {
        "command": "python -m train.overlap " + " ".join(argv if argv is not None else sys.argv[1:]),
        "seed": args.seed, "commit": commit(), "early_ms": args.early_ms, "examples": len(data),
        "interruptions": n_int, "cv_voices_held_out": by_voice, "cv_texts_held_out": by_text,
    }
    ProbeWeights(mean, std, w, b, meta).save(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
