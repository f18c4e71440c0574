"""The native model with the Piper talker: does what it says get heard as words, and what does it cost?

    python -m bench.native.talker                    # 10 held-out questions through the real server
    python -m bench.native.talker --voice flow       # the same with the model's own flow head
    python -m bench.native.talker --cost-only        # only the per-micro-turn cost, in process
    python -m bench.native.talker --pace realtime --words-only   # the questions streamed in real time

1. Words: `duplex serve --model native:tiny --voice piper` (one torch thread, media pace) hears each of
   the held-out FD-bench-style questions (bench/fdbench/_texts.py TURN_QUESTIONS, disjoint from the
   training texts), spoken by espeak-ng, then 5 s of silence. What it says is transcribed by Whisper
   tiny.en and compared with the text it wrote (the transcript deltas): the word error of what it says.
2. Cost: the shipped checkpoint stepped in process on one of those sessions, the same inputs with
   `--voice piper` and `--voice flow`: the median step, and (piper) the talker's own share (the
   phrase-constrained writer and the talker's micro-turn) on the inference thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from bench._server import ServerUnderTest
from bench.fdbench._texts import TURN_QUESTIONS
from bench.fdbench.client import stream

RATE, TURN = 24_000, 4_800
ENV = {"DUPLEX_TORCH_THREADS": "1", "DUPLEX_KV_BUDGET_MB": "64", "DUPLEX_TTS_DETERMINISTIC": "1"}
T = TypeVar("T")
USER_VOICES = ("espeak:en-us", "espeak:en-gb", "espeak:en-us+f3")


def _clip(text: str, voice: str) -> tuple[np.ndarray, int]:
    """0.5 s of silence, the question, 5 s of silence (whole micro-turns); and the question's last micro-turn."""
    from train.episodes import Speaker

    q = Speaker().say(text, voice)
    audio = np.concatenate([np.zeros(RATE // 2, np.float32), q, np.zeros(5 * RATE, np.float32)])
    n = -(-len(audio) // TURN)
    return np.pad(audio, (0, n * TURN - len(audio))), (RATE // 2 + len(q)) // TURN


def _ask(url: str, audio: np.ndarray, pace: str) -> tuple[np.ndarray, str]:
    """Stream `audio` (bench.fdbench's client); the model's audio per input micro-turn (24 kHz) and the
    text it wrote."""
    res = asyncio.run(stream(url, audio, pace=pace))
    if res.errors:
        raise RuntimeError(f"the server answered with errors: {res.errors}")
    ours = res.ours()
    said = np.zeros(len(audio), dtype=np.float32)
    for k in range(len(audio) // TURN):
        parts = ours.get(k, [])
        if parts:
            chunk = np.concatenate(parts)[:TURN]
            said[k * TURN : k * TURN + len(chunk)] = chunk
    return said, "".join(res.transcript)


_CONTRACTIONS = {"i'm": "i am", "it's": "it is", "that's": "that is", "you're": "you are", "here's": "here is",
                 "don't": "do not", "can't": "cannot", "i'd": "i would", "let's": "let us"}


def _expand(text: str) -> str:
    """Whisper writes what Piper says as "I am" as "I'm": the same words, counted as two errors."""
    return " ".join(_CONTRACTIONS.get(w.lower().strip(".,?!"), w) for w in text.split())


def words(voice: str, pace: str = "media") -> dict[str, Any]:
    from models.speech.asr import transcribe
    from train.evaluate import word_errors

    rows: list[dict[str, Any]] = []
    latencies: list[float] = []
    errs = refs = errs_norm = 0
    with ServerUnderTest("--model", "native:tiny", "--voice", voice, "--max-sessions", "1", "--phase-groups", "1",
                         "--background", "none", env=ENV) as server:
        for i, q in enumerate(TURN_QUESTIONS):
            audio, end = _clip(q, USER_VOICES[i % len(USER_VOICES)])
            said, wrote = _ask(server.ws_url, audio, pace)
            loud = np.flatnonzero(np.abs(said.reshape(-1, TURN)).max(axis=1) > 1e-3)
            after = loud[loud > end]
            heard = transcribe(said[(end + 1) * TURN :], RATE) if len(after) else ""
            d, r = word_errors(wrote, heard) if wrote.strip() else (0, 0)
            errs, refs = errs + d, refs + r
            dn, _ = word_errors(wrote, _expand(heard)) if wrote.strip() else (0, 0)
            errs_norm += dn
            latency = round((int(after[0]) - end) * TURN / RATE, 1) if len(after) else None
            if latency is not None:
                latencies.append(latency)
            row = {"question": q, "wrote": wrote.strip(), "heard": heard, "word_errors": d, "words": r,
                   "reply_latency_s": latency, "spoke_over_question": bool(len(loud[loud <= end]))}
            rows.append(row)
            print(f"[{i + 1}/{len(TURN_QUESTIONS)}] {q!r} -> wrote {row['wrote']!r}, Whisper heard {heard!r}",
                  flush=True)
    return {"voice": voice, "pace": pace, "questions": len(rows), "replied": len(latencies),
            "word_error": round(errs / refs, 3) if refs else None, "words": refs,
            "word_error_contractions_expanded": round(errs_norm / refs, 3) if refs else None,
            "median_reply_latency_s": statistics.median(latencies) if latencies else None,
            "rows": rows}


def _timed(fn: Callable[..., T], acc: list[float]) -> Callable[..., T]:
    """`fn`, adding the seconds each call takes to `acc[-1]` (instrumentation of the real method)."""

    def run(*a: Any, **k: Any) -> T:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[-1] += time.perf_counter() - t0

    return run


def cost(repeats: int = 3) -> dict[str, Any]:
    """Median step (ms) of the shipped checkpoint on one held-out question's session, per voice."""
    from models.base import TickInput, wait_work
    from models.interaction import load_native
    from models.interaction.options import NativeOptions

    audio, _ = _clip(TURN_QUESTIONS[0], USER_VOICES[0])
    ticks = [TickInput(audio[k * TURN : (k + 1) * TURN], TURN) for k in range(len(audio) // TURN)]
    result: dict[str, Any] = {"micro_turns": len(ticks), "torch_threads": 1}
    for voice in ("flow", "piper"):
        model = load_native("tiny", device="cpu", options=NativeOptions(voice=voice, threads=1, kv_budget_mb=64))
        if model.talker is not None:
            model.talker.prerendered.join()
        talk: list[float] = []
        if model.talker is not None:  # time the talker's share of the step (writer + micro-turn)
            model._talk = _timed(model._talk, talk)  # type: ignore[method-assign]
            model._write = _timed(model._write, talk)  # type: ignore[method-assign]
        steps: list[float] = []
        cpu: list[float] = []  # the inference thread's own CPU time: robust to a shared machine
        for rep in range(repeats):
            st = model.open(f"cost-{rep}")
            for t in ticks:
                wait_work(model, [st], 60.0)
                talk.append(0.0)
                t0, c0 = time.perf_counter(), time.thread_time()
                model.step([(st, t)])
                steps.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
            model.close(st)
            print(f"cost: {voice} run {rep + 1}/{repeats}: median step {statistics.median(steps) * 1000:.1f} ms",
                  flush=True)
        result[voice] = {"median_step_ms": round(statistics.median(steps) * 1000, 2),
                         "median_step_cpu_ms": round(statistics.median(cpu) * 1000, 2),
                         "p90_step_ms": round(float(np.percentile(steps, 90)) * 1000, 2)}
        if talk and model.talker is not None:
            result[voice]["median_talker_ms"] = round(statistics.median(talk) * 1000, 3)
            result[voice]["p90_talker_ms"] = round(float(np.percentile(talk, 90)) * 1000, 3)
            model.shutdown()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--voice", choices=["piper", "flow"], default="piper")
    ap.add_argument("--pace", choices=["media", "realtime"], default="media", help="how the questions are streamed")
    ap.add_argument("--cost-only", action="store_true", help="skip the server run")
    ap.add_argument("--words-only", action="store_true", help="skip the in-process cost")
    ap.add_argument("--json", help="also write the result to this file")
    a = ap.parse_args(argv)
    os.environ.setdefault("DUPLEX_TTS_DETERMINISTIC", "1")
    out: dict[str, Any] = {}
    if not a.cost_only:
        out["words"] = words(a.voice, a.pace)
        w = out["words"]
        print(f"{w['voice']} ({w['pace']} pace): replied to {w['replied']}/{w['questions']}; word error of what "
              f"it says (Whisper tiny.en "
              f"on its audio vs the text it wrote) {w['word_error']} over {w['words']} words "
              f"({w['word_error_contractions_expanded']} with I'm read as I am...); median reply "
              f"latency {w['median_reply_latency_s']} s", flush=True)
    if not a.words_only:
        out["cost"] = cost()
        print("cost per micro-turn (ms):", json.dumps(out["cost"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
