"""Word error and cost of the cascade's recognisers on a generated FD-bench set's user speech.

    python -m bench.asr_wer --data DIR [--tasks candor_turn_taking synthetic_pause_handling] [--json]

For every sample of the chosen tasks, the reference is the text the generator spoke (generation.json
"texts"), the audio the sample's input.wav (16 kHz, user speech only). Each recogniser transcribes
the whole clip once: pocketsphinx (the full, non-streaming search of `transcribe`), pocketsphinx
streamed in 200 ms chunks with the cascade's two search settings (`sphinx-streaming`, used when it
makes final transcripts; `sphinx-partials`, used for partials beside Whisper), and Whisper tiny.en
(`WhisperTranscriber`, as the cascade runs it: in a window sized to the clip; `whisper-30s-window`
is the same model in its fixed 30 s window, as faster-whisper runs it). WER = word edits / reference words over the
whole set; cost = wall seconds per clip and per second of audio, measured on this machine (one
thread each, so on a busy machine the figures are upper bounds).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from models.speech.asr import ASR_RATE, WhisperTranscriber, transcribe
from models.speech.sphinx import PARTIALS_CONFIG, STREAMING_CONFIG, DecoderPool, SphinxRecognizer
from streaming.resample import resample
from streaming.wav import read_wav

DEFAULT_TASKS = ("candor_turn_taking", "synthetic_pause_handling", "synthetic_user_interruption")


def normalise(text: str) -> list[str]:
    """Lower case words without punctuation; hyphens split words ("mm-hmm" -> "mm hmm")."""
    return re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " ")).split()


def edits(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance in words (substitutions, insertions, deletions)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def streamed(config: dict[str, object]) -> Callable[[np.ndarray], str]:
    """pocketsphinx fed 200 ms at a time with `config`, as a cascade session feeds it."""
    rec = SphinxRecognizer(DecoderPool(1, **config))

    def recognise(x: np.ndarray) -> str:
        rec.start()
        for i in range(0, len(x), ASR_RATE // 5):
            rec.send(x[i : i + ASR_RATE // 5])
        return rec.finish().text

    return recognise


def run(data: Path, tasks: tuple[str, ...]) -> dict[str, dict[str, float]]:
    clips: list[tuple[list[str], np.ndarray]] = []
    for task in tasks:
        for folder in sorted((data / task).glob("*"), key=lambda p: (len(p.name), p.name)):
            gen, wav = folder / "generation.json", folder / "input.wav"
            if not gen.exists() or not wav.exists():
                continue
            texts = json.loads(gen.read_text(encoding="utf-8")).get("texts", [])
            audio, rate = read_wav(wav)
            clips.append((normalise(" ".join(texts)), resample(audio, rate, ASR_RATE)))
    if not clips:
        raise SystemExit(f"no samples with generation.json and input.wav under {data} for tasks {tasks}")
    whisper, whisper_full = WhisperTranscriber(), WhisperTranscriber(window=False)
    recognisers = {
        "pocketsphinx": lambda x: transcribe(x, ASR_RATE),
        "sphinx-streaming": streamed(STREAMING_CONFIG),
        "sphinx-partials": streamed(PARTIALS_CONFIG),
        "whisper-tiny.en": lambda x: whisper.transcribe(x).text,
        "whisper-30s-window": lambda x: whisper_full.transcribe(x).text,
    }
    audio_s = sum(len(x) for _, x in clips) / ASR_RATE
    out: dict[str, dict[str, float]] = {}
    for name, rec in recognisers.items():
        rec(clips[0][1][: ASR_RATE])  # warm-up (lazy allocations), not timed
        errors = words = 0
        seconds = 0.0
        for ref, x in tqdm(clips, desc=name, unit="clip"):
            t = time.perf_counter()
            hyp = normalise(rec(x))
            seconds += time.perf_counter() - t
            errors += edits(ref, hyp)
            words += len(ref)
        out[name] = {
            "clips": len(clips),
            "wer": errors / words,
            "seconds_per_clip": seconds / len(clips),
            "seconds_per_audio_second": seconds / audio_s,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.asr_wer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a set written by `bench.fdbench generate`")
    p.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS), help="task folders to use")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    result = run(args.data, tuple(args.tasks))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{'recogniser':<17} {'clips':>5} {'WER':>7} {'s/clip':>7} {'s/audio s':>9}")
        for name, r in result.items():
            print(f"{name:<17} {r['clips']:>5} {r['wer']:>7.3f} {r['seconds_per_clip']:>7.3f} "
                  f"{r['seconds_per_audio_second']:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
