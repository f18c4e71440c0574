"""`duplex train`: build the episode cache if needed, train with progress, evaluate, save, export.

    duplex train --data data/train --heldout data/heldout --out runs/tiny --minutes 60
    duplex train ... --resume          # continue runs/tiny/state.pt exactly (weights, optimiser, data)

Progress goes to stdout (one line per --log-every steps: losses, tokens/s, ETA) and runs/<out>/log.txt.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from models.interaction.config import ACTIONS, preset
from train.client import AdamParams, TrainingClient
from train.data import DataPosition, EpisodeData
from train.losses import Batch, LossWeights, sft_loss
from train.memory import keep_freed_memory


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="duplex train", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.description = "Train the native interaction model on synthetic full-duplex episodes."
    p.add_argument("--preset", default="tiny", help="native preset to train (tiny, base)")
    p.add_argument("--init", default=None, metavar="FILE", help="start from this checkpoint (default: seeded init)")
    p.add_argument("--data", default="data/train", help="feature cache of training episodes (built if empty)")
    p.add_argument("--heldout", default="data/heldout", help="feature cache of held-out episodes (built if empty)")
    p.add_argument("--episodes", type=int, default=480, help="training episodes to build when --data is empty")
    p.add_argument("--heldout-episodes", type=int, default=24, help="held-out episodes to build when empty")
    p.add_argument("--ticks", "--turns", type=int, default=100, help="micro-turns per built episode (100 = 20 s)")
    p.add_argument("--data-seed", type=int, default=1, help="episode seed (held-out episodes use data-seed + 1)")
    p.add_argument("--out", default="runs/tiny", help="run folder: state.pt, log.txt, the exported checkpoint")
    p.add_argument("--minutes", type=float, default=60.0, help="stop after this much training time in this call")
    p.add_argument("--steps", type=int, default=0, help="stop at this optimiser step (0 = no limit)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                   help="autocast dtype of the matmuls (auto: bf16 only where the device has bf16 arithmetic)")
    p.add_argument("--batch", type=int, default=2, help="episodes per optimiser step")
    p.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    p.add_argument("--warmup", type=int, default=20, help="linear warm-up steps")
    p.add_argument("--decay-steps", type=int, default=0, help="cosine decay to 10%% over this many steps (0 = flat)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0, help="max gradient norm")
    p.add_argument("--onset-weight", type=float, default=LossWeights().onset,
                   help="control-loss weight of the micro-turn where the assistant starts speaking")
    p.add_argument("--hold-weight", type=float, default=LossWeights().hold,
                   help="control-loss weight of staying silent in the 2 s after the user stops (pauses, the "
                        "beat before a reply)")
    p.add_argument("--class-weights", type=float, nargs=len(ACTIONS), default=None, metavar="W",
                   help="control-loss weight of each action, in order " + " ".join(ACTIONS) +
                        f" (default {' '.join(f'{w:g}' for w in LossWeights().classes)}): raise a rare decision "
                        "the model under-takes")
    p.add_argument("--heard-tokens", type=int, default=None, metavar="N",
                   help="give the model the heard-words channel: N bytes a micro-turn of the words a streaming "
                        "recogniser heard (models/interaction/heard.py; 4 for tiny); default: as the preset or "
                        "--init checkpoint has it")
    p.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters of this rank instead (0 = full)")
    p.add_argument("--eval-every", type=int, default=25, help="evaluate on held-out episodes every N steps")
    p.add_argument("--eval-episodes", type=int, default=8, help="held-out episodes per evaluation")
    p.add_argument("--save-minutes", type=float, default=3.0, help="save state and export this often")
    p.add_argument("--log-every", type=int, default=1, help="progress line every N steps")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = all this process may use)")
    p.add_argument("--seed", type=int, default=0, help="training seed (data order, flow noise)")
    p.add_argument("--resume", action="store_true", help="continue from <out>/state.pt")
    p.add_argument("--export", default=None, metavar="FILE",
                   help="also write the served fp16 checkpoint here (default: <out>/native-<preset>.safetensors)")
    p.add_argument("--phrase-wer-episodes", type=int, default=0, metavar="N",
                   help="at the final export, measure the exported flow head's phrase word error on N held-out "
                        "episodes (train.evaluate: vocoder + pocketsphinx, ~15 s an episode on 2 CPU cores) and "
                        "record it in the checkpoint, where --voice auto reads it (0 = not measured: auto "
                        "gives the checkpoint Piper)")
    p.add_argument("--phrase-wer", type=float, default=None, metavar="WER",
                   help="record this phrase word error at every export instead (one measured on these very "
                        "weights, e.g. train.evaluate's voice_wer; a measurement at the end replaces it)")
    return p


def measure_phrase_wer(path: Path, preset_name: str, held: EpisodeData, episodes: int, log: "Log") -> float | None:
    """train.evaluate's voice word error of the checkpoint at `path` (the exported fp16 weights, exactly
    what is served) on the first `episodes` held-out episodes; None where they hold no whole phrase (a
    word error over no words would read as a perfect voice)."""
    from models.interaction.checkpoint import build
    from train.evaluate import evaluate as heldout_eval

    log(f"measuring the phrase word error of {path} on {min(episodes, held.episodes)} held-out episodes")
    r = heldout_eval(build(preset_name, str(path)), held, episodes, voice=True)
    if not r["phrase_words"]:
        log("no whole assistant phrase in those held-out episodes: phrase word error not recorded; "
            "pass more --phrase-wer-episodes")
        return None
    log(f"phrase word error {r['voice_wer']:.3f} over {r['phrase_words']} words "
        f"(the vocoder + ASR floor on the target mel: {r['vocoder_floor_wer']:.3f})")
    return float(r["voice_wer"])


def _lr(a: argparse.Namespace, step: int) -> float:
    warm = min(1.0, (step + 1) / max(a.warmup, 1))
    if a.decay_steps <= 0:
        return float(a.lr * warm)
    frac = min(step / a.decay_steps, 1.0)
    return float(a.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))))


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Log:
    def __init__(self, path: Path) -> None:
        self.file = path.open("a")

    def __call__(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def ensure_data(path: Path, episodes: int, seed: int, ticks: int, keep_audio: bool, log: Log) -> None:
    if any(path.glob("shard-*.npz")) and (path / "info.json").exists():
        return
    from train.features import build_cache

    os.environ.setdefault("DUPLEX_TTS_DETERMINISTIC", "1")  # the assistant's voice: the same take every time
    log(f"building {episodes} episodes of {ticks} micro-turns into {path} (seed {seed})")
    build_cache(path, preset("tiny"), seed, episodes, ticks, keep_audio=keep_audio, log=log)


@torch.no_grad()
def evaluate(tc: TrainingClient, data: EpisodeData, batch: int, episodes: int = 0) -> dict[str, float]:
    """Mean losses and control accuracy over the first `episodes` held-out episodes (0 = all), teacher-forced."""
    tc.net.eval()
    g = torch.Generator().manual_seed(0)  # the same flow noise at every evaluation: comparable numbers
    sums: dict[str, float] = {}
    n = 0
    total = min(episodes or data.episodes, data.episodes)
    for i in range(0, total, batch):
        b = data.batch(list(range(i, min(i + batch, total)))).to(tc.device)
        _, m = sft_loss(tc.forward(b), b, tc.net.flow, tc.weights, g)
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v * b.rows
        n += b.rows
    tc.net.train()
    return {k: v / n for k, v in sums.items()}


def run(a: argparse.Namespace) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "log.txt")
    if a.threads:
        torch.set_num_threads(a.threads)
    keep_freed_memory()  # large activations reused, not page-faulted in every step (train/memory.py)
    ensure_data(Path(a.data), a.episodes, a.data_seed, a.ticks, False, log)
    ensure_data(Path(a.heldout), a.heldout_episodes, a.data_seed + 1, a.ticks, True, log)
    weights = LossWeights(onset=a.onset_weight, hold=a.hold_weight)
    if a.class_weights:
        weights.classes = list(a.class_weights)
    tc = TrainingClient(a.preset, a.init, a.lora_rank, a.device, a.precision, a.seed, weights,
                        heard_tokens=a.heard_tokens)
    cfg = tc.net.cfg  # the preset's, or the --init checkpoint's (with the heard channel when asked)
    data = EpisodeData(Path(a.data), cfg, seed=a.seed)
    held = EpisodeData(Path(a.heldout), cfg)
    adam = AdamParams(lr=a.lr, weight_decay=a.weight_decay, clip=a.clip)
    state_path = out / "state.pt"
    trained_s = 0.0
    if a.resume:
        if not state_path.exists():
            log(f"--resume: {state_path} does not exist; start without --resume or point --out at the run")
            return 2
        extra = tc.load_state(state_path, adam)
        data.pos = DataPosition(**extra["data_position"])
        trained_s = float(extra.get("trained_s", 0.0))
        log(f"resumed {state_path} at step {tc.step}, data position {extra['data_position']}")
    tokens_per_step = a.batch * data.ticks * cfg.tokens_per_tick
    # The metadata key stays "turns": checkpoints already written and shipped carry it.
    meta = {
        "command": "duplex train " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["train"] else sys.argv[1:]),
        "data_seed": str(a.data_seed), "data_episodes": str(data.episodes), "turns": str(data.ticks),
        "commit": _commit(), "trainer": "train.cli",
    }
    export = Path(a.export) if a.export else out / f"native-{a.preset}.safetensors"
    log(f"training native:{a.preset} on {data.episodes} episodes x {data.ticks} micro-turns, "
        f"{tokens_per_step} tokens/step, {a.device} {tc.precision}, lora rank {a.lora_rank}, {a.minutes} min")

    def save(reason: str) -> None:
        tc.save_state(state_path, {"data_position": data.pos.as_dict(), "trained_s": trained_s})
        meta["step"] = str(tc.step)
        meta["trained_minutes"] = f"{trained_s / 60:.1f}"
        tc.export(export, meta, phrase_wer=a.phrase_wer)
        log(f"saved {state_path} and {export} at step {tc.step} ({reason})")

    start = time.monotonic()
    last_save = start
    window: list[tuple[float, int]] = []
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= a.minutes * 60 or (a.steps and tc.step >= a.steps):
            break
        t0 = time.monotonic()
        batch: Batch = data.next_batch(a.batch)
        fb = tc.forward_backward(batch, "sft")
        opt = tc.optim_step(AdamParams(lr=_lr(a, tc.step), weight_decay=a.weight_decay, clip=a.clip))
        dt = time.monotonic() - t0
        trained_s += dt
        window = ([*window, (dt, fb.tokens)])[-20:]
        tps = sum(n for _, n in window) / sum(d for d, _ in window)
        left = a.minutes * 60 - (time.monotonic() - start)
        if a.steps:
            left = min(left, (a.steps - tc.step) * tokens_per_step / tps)
        if tc.step % a.log_every == 0:
            m = fb.metrics
            log(f"step {tc.step} loss {m['loss']:.3f} (control {m['control']:.3f} acc {m['control_acc']:.2f} "
                f"vad {m['vad']:.3f} text {m['text']:.3f} transcript {m['transcript']:.3f} flow {m['flow']:.3f}) "
                f"grad {opt['grad_norm']:.2f} lr {opt['lr']:.2e} {tps:.0f} tok/s "
                f"epoch {data.pos.epoch} ETA {max(left, 0) / 60:.1f} min")
        if a.eval_every and tc.step % a.eval_every == 0:
            ev = evaluate(tc, held, a.batch, a.eval_episodes)
            log("eval " + json.dumps({k: round(v, 4) for k, v in ev.items()}) + f" step {tc.step}")
        if time.monotonic() - last_save >= a.save_minutes * 60:
            save("periodic")
            last_save = time.monotonic()
    save("end")
    if a.phrase_wer_episodes > 0:
        wer = measure_phrase_wer(export, a.preset, held, a.phrase_wer_episodes, log)
        if wer is not None:
            tc.export(export, meta, phrase_wer=wer)
            log(f"recorded phrase word error {wer:.3f} in {export}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
