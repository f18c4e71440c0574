"""How the cascade handles speech over its own reply: interruptions' pause latency, backchannels spared.

    python -m bench.overlap_handling [--model-options overlap_words=false] [--voices 1] [--seed 11] [--json]

Every utterance of train/_texts.py's OVERLAP_INTERRUPTIONS and OVERLAP_BACKCHANNELS (not the
benchmark's texts) is rendered as the overlap probe's trainer renders it (train.overlap.render: Piper
joe or an espeak-ng voice at a random rate and pitch, a noise floor), brought to the user's own level
+-3 dB (this measures words and timing, not the background gate), and played over a reply the cascade
is speaking: a session asks a question, a fast background answers it (a few words per micro-turn, as
tests/models/test_cascade.py does), and the overlap starts two seconds into the reply. The session is
stepped in media pace (each step waits for the off-thread work due at it), so the figures do not
depend on this machine's load.

Short commands ("Stop.", "Hold on.": `COMMANDS`, not training texts) are played the same way: they are
said and then wait for the reply to stop, so they must stop it before their silence closes the overlap.

Reports, per run: interruptions' pause latency (from the overlap's first speech to the end of the
micro-turn in which the reply paused or stopped: mean, p90, how many over 0.6 s, how many never);
backchannels never paused, those still talking when the overlap ended (the micro-turn holding its last
speech plus 200 ms, fdbench's "kept talking" with its micro-pause bridge), the reply's silence a
backchannel caused (micro-turns paused), what paused them first (the probe, or the length rule),
and those that stopped the reply for good (a barge-in); commands that stopped it. `--json` adds one row per
clip.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from typing import Any

import numpy as np

from models.base import BackgroundChunk, TickInput, wait_work
from models.cascade import CascadeModel, load_cascade
from models.speech.tts import list_voices, synthesize
from models.speech.vad import speech_segments
from models.turns.level import speech_db
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, Audio

TICK_S = TICK_SAMPLES / SAMPLE_RATE
QUESTION = "Tell me about the old harbour."
ANSWER = ("The old harbour was built three hundred years ago for fishing boats. Today it is full of small "
          "sailing yachts and cafes. In summer there is a market on the quay every Saturday morning.")
_ids = itertools.count()
# Short commands that are said and then wait for the reply to stop: none is a training text
# (train/_texts.py's interruptions are whole sentences, barge-ins by length before they fall silent).
COMMANDS = ["Stop.", "Wait.", "Hold on.", "No, stop.", "Hang on.", "Excuse me.", "Stop talking.", "Quiet, please."]


class Session:
    """One cascade session stepped in media pace; answers its delegate with background chunks."""

    def __init__(self, model: CascadeModel) -> None:
        self.m, self.s = model, model.open(f"bench-overlap-{next(_ids)}")
        self.n = 0
        self.loud: list[bool] = []
        self.yielded = False
        self.pending: dict[int, BackgroundChunk] = {}

    def step(self, audio: Audio) -> None:
        tick = np.zeros(TICK_SAMPLES, dtype=np.float32)
        tick[: len(audio)] = audio[:TICK_SAMPLES]
        wait_work(self.m, [self.s])
        bg = [self.pending.pop(self.n)] if self.n in self.pending else []
        out = self.m.step([(self.s, TickInput(tick, TICK_SAMPLES, background=bg))])[0]
        if any(e.type == "delegate" for e in out.events):
            words = ANSWER.split(" ")
            for k, i in enumerate(range(0, len(words), 4)):
                last = i + 4 >= len(words)
                text = " ".join(words[i : i + 4]) + ("" if last else " ")
                self.pending[self.n + 2 + k] = BackgroundChunk("r1", 1, text, last)
        self.yielded |= any(e.type == "yielded" for e in out.events)
        self.loud.append(not out.silent)
        self.n += 1

    def feed(self, audio: Audio) -> None:
        for i in range(0, len(audio), TICK_SAMPLES):
            self.step(audio[i : i + TICK_SAMPLES])

    def close(self) -> None:
        self.m.close(self.s)


def _speech(text: str) -> Audio:
    audio, sr = synthesize(text)
    return resample(audio, sr, SAMPLE_RATE)


def _talking(model: CascadeModel, question: Audio) -> Session:
    """A session whose reply has been audible for two seconds."""
    s = Session(model)
    s.feed(np.concatenate([np.zeros(SAMPLE_RATE // 2, dtype=np.float32), question]))
    quiet = np.zeros(TICK_SAMPLES, dtype=np.float32)
    for _ in range(100):
        if sum(s.loud) >= 10:
            return s
        s.step(quiet)
    raise RuntimeError("the cascade never answered the bench's question; is the model loaded correctly?")


def run_one(model: CascadeModel, question: Audio, clip: Audio, rng: random.Random) -> dict[str, Any] | None:
    """Play `clip` over a reply; None when the clip holds no speech Silero finds."""
    segments = speech_segments(clip, SAMPLE_RATE)
    if not segments:
        return None
    s = _talking(model, question)
    try:
        mine, level = s.s.user.db, speech_db(resample(clip, SAMPLE_RATE, 16_000))
        if mine is not None and level is not None:
            clip = np.clip(clip * 10 ** ((mine + rng.uniform(-3, 3) - level) / 20), -1, 1).astype(np.float32)
        start = s.n
        audio = np.concatenate([clip, np.zeros(SAMPLE_RATE * 6 // 10, dtype=np.float32)])
        paused = cause = words = p = None
        held: list[bool] = []  # per micro-turn: the reply was held (paused) or gone (yielded)
        for i in range(0, len(audio), TICK_SAMPLES):
            s.step(audio[i : i + TICK_SAMPLES])
            held.append(s.s.turn.paused or s.yielded)
            words = s.s.overlap.words or words
            p = s.s.overlap.p_interrupt if s.s.overlap.p_interrupt is not None else p
            if paused is None and held[-1]:
                paused = (s.n - start) * TICK_S - segments[0][0]
                cause = _cause(model, s)
        # The micro-turn holding the overlap's last speech, and the next one (the 200 ms bridge).
        end = int(segments[-1][1] / TICK_S)
        kept = not s.yielded and not all(held[end : end + 2])
        return {"paused": paused, "cause": cause, "yielded": s.yielded, "kept": kept,
                "silent_s": round(sum(held) * TICK_S, 2), "words": words,
                "p_interrupt": None if p is None else round(p, 3)}
    finally:
        s.close()


def _cause(model: CascadeModel, s: Session) -> str:
    """Why the reply was first held: a barge-in, the probe's early pause, or the length rule."""
    if s.yielded:
        return "barge-in"
    p = s.s.overlap.p_interrupt
    return "probe" if p is not None and p >= model.opts.barge_in_early_p else "length"


def main(argv: list[str] | None = None) -> int:
    from train._texts import OVERLAP_BACKCHANNELS, OVERLAP_INTERRUPTIONS
    from train.overlap import render

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-options", default="", help="cascade options, as in --model cascade:OPTIONS")
    ap.add_argument("--voices", type=int, default=1, help="voices per text (random, seeded)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    model = load_cascade(a.model_options)
    rng = random.Random(a.seed)
    voices = list_voices()
    if len(voices) < a.voices:
        print(f"only {len(voices)} voices installed ({voices}); install espeak-ng for more", file=sys.stderr)
        return 2
    question = _speech(QUESTION)
    jobs = [(label, text) for label, texts in (("interruption", OVERLAP_INTERRUPTIONS), ("command", COMMANDS),
                                                ("backchannel", OVERLAP_BACKCHANNELS)) for text in texts]
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        for k, (label, text) in enumerate(jobs, 1):
            for voice in rng.sample(voices, a.voices):
                r = run_one(model, question, render(text, voice, rng), rng)
                if r is not None:
                    rows.append({"kind": label, "text": text, "voice": voice, **r})
            rate = k / (time.monotonic() - t0)
            print(f"  {k}/{len(jobs)} texts, ETA {(len(jobs) - k) / rate:.0f} s", file=sys.stderr, flush=True)
    finally:
        model.shutdown()
    ints = [r for r in rows if r["kind"] == "interruption"]
    bcs = [r for r in rows if r["kind"] == "backchannel"]
    cmds = [r for r in rows if r["kind"] == "command"]
    lat = [r["paused"] for r in ints if r["paused"] is not None]
    summary: dict[str, Any] = {
        "model_options": a.model_options,
        "interruptions": len(ints),
        "interruption_pause_mean_s": round(float(np.mean(lat)), 3) if lat else None,
        "interruption_pause_p90_s": round(float(np.percentile(lat, 90)), 3) if lat else None,
        "interruptions_paused_after_0.6_s": sum(v > 0.6 for v in lat),
        "interruptions_never_paused": len(ints) - len(lat),
        "commands": len(cmds),
        "commands_that_stopped_the_reply": sum(r["yielded"] for r in cmds),
        "backchannels": len(bcs),
        "backchannels_never_paused": sum(r["paused"] is None for r in bcs),
        "backchannels_kept_talking": sum(r["kept"] for r in bcs),
        "backchannels_paused_by_probe": sum(r["cause"] == "probe" for r in bcs),
        "backchannels_paused_by_length": sum(r["cause"] == "length" for r in bcs),
        "backchannel_silence_mean_s": round(float(np.mean([r["silent_s"] for r in bcs])), 3) if bcs else None,
        "backchannels_that_stopped_the_reply": sum(r["yielded"] for r in bcs),
    }
    if a.json:
        print(json.dumps({**summary, "rows": rows}))
    else:
        for name, value in summary.items():
            print(f"{name:40} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
