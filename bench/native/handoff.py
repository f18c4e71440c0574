"""Whether the native model hands a request to the background reasoner or answers it itself, closed loop.

    python -m bench.native.handoff --typed              # with the turn check and without, every voice, typed
    python -m bench.native.handoff --turn-check words --voices 2 --json

`train.evaluate` measures hand-offs teacher-forced on held-out episodes, whose requests are training's
sentences. This bench asks what the served loop does with requests no training text holds: look-ups in
new words and on new topics ("Could you look up the train times to Leeds for tomorrow?") and questions
that want a plain reply ("How do I say no to a friend politely?"), each said alone after 0.6 s of silence
in voices and rates training used little or never, then 4 s of silence. The model is stepped in process as
the server steps it at media pace (Piper speaks its text and it hears that back; the turn check's Whisper
and text model on their worker thread, waited for as a media-pace engine waits; one torch thread), once
per `--native-turn-check` mode: `words` (as served where Whisper is installed: the words settle whether a
turn is finished and whether it asks for a look-up, models/interaction/turn_check.py) and `off` (the
model alone). `--typed` also types every request (the text whole in one micro-turn, a silent mic, 6 s to
answer it in), reported apart.

Per mode: look-ups handed off (a `delegate` event between the request's last 0.4 s and the end of the
silence after it), questions handed off (the false ones: the reasoner answers what the model should
have), requests left unanswered (neither a hand-off nor speech), the mean time from a request's end to
the first hand-off or speaking micro-turn's output, and the questions' replies that are the holding
phrase (a hand-off's, said without one). Hand-offs go out with the words the recogniser streamed
(`--native-query heard`: the bench counts them, it does not ask a reasoner).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.interaction.options import TURN_CHECK_MODES
from streaming.types import TICK_SECONDS

# Requests that ask in so many words for something looked up, found or checked, as training's look-ups
# do, but none of its sentences or topics.
LOOKUPS = (
    "Could you look up the train times to Leeds for tomorrow?",
    "Please find out if the post office is open on Sunday.",
    "Can you check how busy the motorway is right now?",
    "Search for a good Italian restaurant near the harbour.",
    "Look up the address of the nearest hospital.",
    "Find out how much it costs to park in the city centre.",
    "Would you check whether my flight to Rome is delayed?",
    "Can you find the opening times of the zoo?",
    "Please look up who won the tennis final yesterday.",
    "Check what time the concert starts on Friday.",
    "Could you search for the cheapest hotel in Madrid?",
    "Find out when the next bus to the university leaves.",
)
# Questions and requests that want the model's own reply, none of training's.
QUESTIONS = (
    "What do you think makes a good friend?",
    "How do I stay calm before a job interview?",
    "Should I paint the fence white or green?",
    "Can you give me a tip for learning new words?",
    "Why do people enjoy watching the sea?",
    "How can I make my small garden look bigger?",
    "Is it better to run in the morning or the evening?",
    "Tell me something nice about autumn.",
    "Which is more relaxing, reading or painting?",
    "What should I pack for a weekend by the sea?",
    "Do you have any advice for a long flight?",
    "How do I say no to a friend politely?",
)
# (voice, rate): one Piper voice the model heard in a third of training's user turns, espeak voices and
# rates it heard seldom (en-029) or never (en-gb-x-rp, the f4 variant, other rates).
VOICES = (("espeak:en-gb-x-rp", 1.0), ("piper:joe", 0.9), ("espeak:en-us+f4", 1.1), ("espeak:en-029", 0.9))
MODES = ("words", "off")
HOLDING = "Please give me one moment."  # training's holding phrase (train/episodes.py), a hand-off's
LEAD_S, TAIL_S = 0.6, 4.0
EARLY_TICKS = 2  # a hand-off counts from the request's last 0.4 s (the voice head hears the end late or early)
TYPED = "typed"  # the requests typed instead (`--typed`): no voice, the text whole in one micro-turn
TYPED_TAIL_S = 6.0  # the model reads typed text a few bytes a micro-turn: a long request takes ~3 s to read


@dataclass
class Outcome:
    kind: str  # "lookup" | "question"
    text: str
    voice: str
    handed_off: bool  # a delegate event after the request (from its last EARLY_TICKS micro-turns)
    spoke: bool  # the model spoke after the request
    first_s: float | None  # the first hand-off or speaking micro-turn's output time after the request's end
    said: str  # what it said after the request


def _requests(voices: int, typed: bool) -> list[tuple[str, str, str, float]]:
    ways = [*VOICES[:voices], *([(TYPED, 1.0)] if typed else [])]
    return [(kind, text, v, rate) for v, rate in ways
            for kind, texts in (("lookup", LOOKUPS), ("question", QUESTIONS)) for text in texts]


def _runs(args: tuple[str, list[tuple[str, str, str, float]], str | None]) -> list[Outcome]:
    """Every request, closed loop, in one turn-check mode (one process: one model, its talker and check)."""
    import torch

    from models.base import TickInput, wait_work
    from models.interaction import load_native
    from models.interaction.options import NativeOptions
    from streaming.types import SAMPLE_RATE, TICK_SAMPLES
    from train.episodes import Speaker

    mode, requests, checkpoint = args
    os.environ.setdefault("DUPLEX_TTS_DETERMINISTIC", "1")
    torch.set_num_threads(1)
    spk = Speaker()
    model = load_native("tiny", checkpoint, device="cpu",
                        options=NativeOptions(threads=1, kv_budget_mb=64, voice="piper", query="heard",
                                              turn_check=mode, overlap_check="off"))
    out = []
    try:
        for i, (kind, text, voice, rate) in enumerate(requests):
            # Typed: the text arrives whole after the lead, over a silent mic; it counts from its arrival.
            speech = np.zeros(0, np.float32) if voice == TYPED else spk.say(text, voice, rate)
            lead = np.zeros(int(LEAD_S * SAMPLE_RATE), np.float32)
            tail = TYPED_TAIL_S if voice == TYPED else TAIL_S
            audio = np.concatenate([lead, speech, np.zeros(int(tail * SAMPLE_RATE), np.float32)])
            n = -(-len(audio) // TICK_SAMPLES)
            audio = np.pad(audio, (0, n * TICK_SAMPLES - len(audio)))
            end = (len(lead) + len(speech)) / SAMPLE_RATE
            after = int(end / TICK_SECONDS) - (0 if voice == TYPED else EARLY_TICKS)
            st = model.open(f"handoff-{i}")
            handed, spoke, first, said = False, False, None, ""
            try:
                for k in range(n):
                    wait_work(model, [st], 60.0)  # as the media-pace engine: due synthesis and checks
                    typed = [text] if voice == TYPED and k == after else []
                    tick = model.step([(st, TickInput(audio[k * TICK_SAMPLES : (k + 1) * TICK_SAMPLES],
                                                      TICK_SAMPLES, text=typed))])[0]
                    if k < after:
                        continue
                    took = any(e.type == "delegate" for e in tick.events)
                    said += tick.text
                    handed, spoke = handed or took, spoke or st.speaking
                    if first is None and (took or st.speaking):
                        first = max(0.0, (k + 1) * TICK_SECONDS - end)
            finally:
                model.close(st)
            out.append(Outcome(kind, text, voice, handed, spoke, first, said.strip()))
            print(f"native_handoff: turn check {mode}: {i + 1}/{len(requests)} {kind} {voice}: "
                  f"{'handed off' if handed else 'spoke' if spoke else 'nothing'}", file=sys.stderr, flush=True)
    finally:
        model.shutdown()
    return out


def summarise(mode: str, runs: list[Outcome]) -> dict[str, Any]:
    row: dict[str, Any] = {"turn_check": mode}
    for kind in ("lookup", "question"):
        typed = [r for r in runs if r.kind == kind and r.voice == TYPED]
        if typed:
            row[f"typed_{kind}s_handed_off"] = f"{sum(r.handed_off for r in typed)}/{len(typed)}"
        rs = [r for r in runs if r.kind == kind and r.voice != TYPED]
        row[f"{kind}s_handed_off"] = f"{sum(r.handed_off for r in rs)}/{len(rs)}"
        row[f"{kind}s_unanswered"] = sum(not (r.handed_off or r.spoke) for r in rs)
        firsts = [r.first_s for r in rs if r.first_s is not None]
        row[f"{kind}_first_response_s"] = round(float(np.mean(firsts)), 3) if firsts else None
    row["questions_holding_phrase"] = sum(r.kind == "question" and not r.handed_off and r.said.startswith(HOLDING)
                                          for r in runs)
    row["missed_lookups"] = [f"{r.text} ({r.voice})" for r in runs if r.kind == "lookup" and not r.handed_off]
    row["handed_off_questions"] = [f"{r.text} ({r.voice})" for r in runs if r.kind == "question" and r.handed_off]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turn-check", nargs="+", choices=TURN_CHECK_MODES, default=list(MODES),
                    help="`--native-turn-check` modes to serve in, one process each")
    ap.add_argument("--voices", type=int, default=len(VOICES), choices=range(1, len(VOICES) + 1),
                    help=f"how many of the {len(VOICES)} voices to say every request in")
    ap.add_argument("--typed", action="store_true", help="also type every request (the text whole, a silent mic)")
    ap.add_argument("--checkpoint", default=None, help="native checkpoint (default: the shipped one)")
    ap.add_argument("--jobs", type=int, default=2, help="modes run in parallel, one process each")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args(argv)
    modes = list(dict.fromkeys(a.turn_check))
    requests = _requests(a.voices, a.typed)
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, min(a.jobs, len(modes)))) as pool:
        results = list(pool.map(_runs, [(m, requests, a.checkpoint) for m in modes]))
    rows = [summarise(m, r) for m, r in zip(modes, results, strict=True)]
    if a.json:
        print(json.dumps({"requests": len(requests), "voices": [v for v, _ in VOICES[: a.voices]], "rows": rows}))
        return 0
    print(f"{len(requests)} requests ({len(requests) // 2} look-ups, {len(requests) // 2} questions, "
          f"{'typed too' if a.typed else 'said'}), {time.monotonic() - t0:.0f} s")
    print("| turn check | look-ups handed off | questions handed off | unanswered (look-ups, questions) |"
          " first response s (look-ups, questions) | questions answered with the holding phrase |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['turn_check']} | {r['lookups_handed_off']} | {r['questions_handed_off']} | "
              f"{r['lookups_unanswered']}, {r['questions_unanswered']} | "
              f"{r['lookup_first_response_s']}, {r['question_first_response_s']} | {r['questions_holding_phrase']} |")
    for r in rows:
        if a.typed:
            print(f"turn check {r['turn_check']}: typed look-ups handed off {r['typed_lookups_handed_off']}, "
                  f"typed questions {r['typed_questions_handed_off']}")
    for r in rows:
        print(f"turn check {r['turn_check']}: missed look-ups {r['missed_lookups']}; "
              f"questions handed off {r['handed_off_questions']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
