"""Client delegation through GPT-Live: from `session.delegation.created` to the commentary's first sound.

Each trial is one session on `/v1/live/sessions` under client delegation (the protocol's default):
half a second of silence, a spoken look-up question (Piper, through the FD-bench generator's
`Speaker`), then silence. When the model hands the question off, the client answers at once with
`session.commentary.append` naming the delegation, as an app's backend with the answer ready would.
The cascade says a commentary as given, so its words are known; the trial measures the wait from the
moment `session.delegation.created` arrived to the moment the first non-silent output audio delta of
the commentary arrived (wall clock, what the app's user waits), and the same span on the session's
timeline (micro-turns between the two). The commentary's first micro-turn is the first loud one at or
after the output transcript fragment that starts its words (an acknowledgement such as "Okay." may
play before it; that is not the answer).

What the app does between the two events (looking the answer up) is not in the figure: the commentary
is sent as soon as the delegation arrives.

    python -m bench.live_delegation --trials 10 [--pace realtime|media] [--url ws://HOST:PORT] [--json]

Without `--url` it starts its own `duplex serve --model cascade --background none` (client
delegation needs no reasoner on the server; the cascade is the voice that hands off look-ups).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import re
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench._server import local_server
from bench.fdbench import live_client
from bench.wsclient import open_session
from streaming.pcm import Audio
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, TICK_SECONDS

# Look-ups the cascade hands off (a question it cannot answer from the conversation), each with the
# answer the app's backend would give; cycled over the trials.
LOOKUPS: tuple[tuple[str, str], ...] = (
    ("Can you look up the weather in Paris for me?", "The weather in Paris is sunny and warm today."),
    ("Could you check when the next train to Boston leaves?",
     "The next train to Boston leaves at four fifteen from platform two."),
    ("Can you look up the opening hours of the city library?",
     "The city library is open from nine in the morning until six in the evening."),
    ("Please search for the score of last night's football game.",
     "The home team won the game three to one last night."),
    ("Can you find out how much a flight to Rome costs next week?",
     "A return flight to Rome next week costs about three hundred euros."),
)
LEAD_S = 0.5  # silence before the question
AFTER_S = 12.0  # silence after it, at most: the hand-off and the commentary's start come within it
FLOOR_P50_S = 0.6  # the floor docs/live.md sets for delegation: p50 at most this
TICK_MS = round(TICK_SECONDS * 1000)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


@dataclass
class Trial:
    """One session's hand-off and what was heard of the commentary."""

    question: str
    answer: str
    heard: str = ""  # the input transcript (what the model understood)
    delegated_at: float | None = None  # wall clock (monotonic) session.delegation.created arrived
    delegation_tick: int | None = None  # its micro-turn (offset_ms / 200)
    placed_tick: int | None = None  # the micro-turn the commentary was placed on (its ack's start_ms / 200)
    spoken_tick: int | None = None  # the output transcript fragment that starts the commentary's words
    audio: list[tuple[float, bool]] = field(default_factory=list)  # per micro-turn: (arrival, loud)
    said: list[tuple[int, str]] = field(default_factory=list)  # output transcript: (micro-turn, fragment)
    errors: list[str] = field(default_factory=list)

    def onset_tick(self) -> int | None:
        """The commentary's first non-silent micro-turn."""
        if self.spoken_tick is None:
            return None
        return next((k for k in range(self.spoken_tick, len(self.audio)) if self.audio[k][1]), None)

    def latency_s(self) -> float | None:
        """Wall clock: delegation event received -> the commentary's first loud audio received."""
        k = self.onset_tick()
        if k is None or self.delegated_at is None:
            return None
        return self.audio[k][0] - self.delegated_at

    def timeline_s(self) -> float | None:
        """The same on the session's timeline: micro-turns from the hand-off's to the commentary's first sound."""
        k = self.onset_tick()
        if k is None or self.delegation_tick is None:
            return None
        return round((k - self.delegation_tick) * TICK_SECONDS, 3)

    def said_before(self) -> str:
        """What the model said from the hand-off until the commentary (its acknowledgement)."""
        if self.delegation_tick is None:
            return ""
        end = self.spoken_tick if self.spoken_tick is not None else math.inf
        return "".join(text for k, text in self.said if self.delegation_tick <= k < end).strip()

    def on_event(self, ev: dict[str, Any], now: float) -> dict[str, Any] | None:
        """Take one server event received at `now`; the commentary to send when it is a hand-off."""
        kind = ev.get("type")
        if kind == "session.output_audio.delta":
            self.audio.append((now, not live_client.silent(base64.b64decode(ev.get("delta", "")))))
        elif kind == "session.delegation.created":
            if self.delegated_at is None:
                self.delegated_at = now
                self.delegation_tick = int(ev.get("offset_ms", 0)) // TICK_MS
            # The app answers every hand-off at once (only the first is measured).
            return {"type": "session.commentary.append", "content": self.answer,
                    "delegation_id": ev["delegation"]["id"]}
        elif kind == "session.commentary.appended" and self.placed_tick is None:
            self.placed_tick = int(ev.get("start_ms", 0)) // TICK_MS
        elif kind == "session.input_transcript.delta":
            self.heard += str(ev.get("delta", ""))
        elif kind == "session.output_transcript.delta":
            tick, text = int(ev.get("end_ms", 0)) // TICK_MS - 1, str(ev.get("delta", ""))
            self.said.append((tick, text))
            placed = self.placed_tick is not None and int(ev.get("start_ms", 0)) // TICK_MS >= self.placed_tick
            if self.spoken_tick is None and placed and _starts_answer(text, self.answer):
                self.spoken_tick = tick
        elif kind == "error":
            self.errors.append(str(ev.get("error"))[:200])
        return None

    def done(self) -> bool:
        k = self.onset_tick()
        return k is not None and len(self.audio) > k + 2  # a little of it heard


def _starts_answer(fragment: str, answer: str) -> bool:
    words, want = _words(fragment), _words(answer)
    return bool(words) and want[: len(words)] == words


async def _trial(url: str, question: Audio, q: str, answer: str, pace: str, timeout: float) -> Trial:
    trial = Trial(q, answer)
    n_lead = round(LEAD_S / TICK_SECONDS)
    clip = np.concatenate([np.zeros(n_lead * TICK_SAMPLES, np.float32), question])
    n_ticks = -(-len(clip) // TICK_SAMPLES) + round(AFTER_S / TICK_SECONDS)
    padded = np.zeros(n_ticks * TICK_SAMPLES, np.float32)
    padded[: len(clip)] = clip
    async with open_session(url, open_timeout=min(timeout, 20.0)) as ws:
        await ws.send(live_client.start_message(pace, delegation={"type": "client"}))
        await live_client.wait_started(ws)
        answered = asyncio.Event()  # media pace: the micro-turn just sent has its delta

        async def reader() -> None:
            async for raw in ws:
                if isinstance(raw, bytes):
                    continue
                ev = json.loads(raw)
                reply = trial.on_event(ev, time.monotonic())
                if reply is not None:
                    await ws.send(json.dumps(reply))
                if ev.get("type") == "session.output_audio.delta":
                    answered.set()

        task = asyncio.create_task(reader())
        try:
            t0 = time.monotonic()
            for i in range(n_ticks):
                if task.done():
                    task.result()
                    break
                if trial.done():
                    break
                chunk = padded[i * TICK_SAMPLES : (i + 1) * TICK_SAMPLES]
                if pace == "realtime":
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * TICK_SECONDS - time.monotonic()))
                    await ws.send(live_client.append_message(chunk))
                else:  # media: the next micro-turn once this one is answered (the model's own speed)
                    answered.clear()
                    await ws.send(live_client.append_message(chunk))
                    await asyncio.wait_for(answered.wait(), timeout)
            await asyncio.sleep(2 * TICK_SECONDS)  # the last deltas
            await ws.send(json.dumps({"type": "session.close"}))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return trial


def quantile(values: list[float], q: float) -> float | None:
    """Nearest rank (as bench.answer_lag): a value some trial measured."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _speak(texts: list[str]) -> dict[str, Audio]:
    from bench.fdbench.generate import RATE, Speaker, Voice

    speaker = Speaker()
    voice = next((v for v in speaker.voices if v.startswith("piper:")), speaker.voices[0])
    return {t: resample(speaker.say(t, Voice(voice, 1.0, 1.0)), RATE, SAMPLE_RATE) for t in texts}


async def _run(url: str, trials: int, pace: str, timeout: float, speech: dict[str, Audio]) -> list[Trial]:
    out = []
    for i in range(trials):
        q, answer = LOOKUPS[i % len(LOOKUPS)]
        trial = await asyncio.wait_for(_trial(url, speech[q], q, answer, pace, timeout), timeout)
        lat, line = trial.latency_s(), f"[bench.live_delegation] trial {i + 1}/{trials}: "
        if trial.delegated_at is None:
            line += f"not handed off (heard {trial.heard.strip()!r})"
        elif lat is None:
            line += "handed off, commentary not heard before the trial ended"
        else:
            line += (f"{lat:.3f} s wall, {trial.timeline_s():.1f} s timeline "
                     f"(said before it: {trial.said_before()!r})")
        print(line + (f"; errors: {trial.errors[:2]}" if trial.errors else ""), file=sys.stderr, flush=True)
        out.append(trial)
    return out


def summarize(trials: list[Trial], pace: str) -> dict[str, Any]:
    wall = [x for t in trials if (x := t.latency_s()) is not None]
    timeline = [x for t in trials if (x := t.timeline_s()) is not None]
    p50 = quantile(wall, 0.5)
    return {
        "benchmark": "live_delegation", "pace": pace, "trials": len(trials),
        "handed_off": sum(t.delegated_at is not None for t in trials), "measured": len(wall),
        "latency_s_p50": round(p50, 3) if p50 is not None else None,
        "latency_s_p90": round(q, 3) if (q := quantile(wall, 0.9)) is not None else None,
        "latency_s_max": round(max(wall), 3) if wall else None,
        "timeline_s_p50": quantile(timeline, 0.5), "timeline_s_p90": quantile(timeline, 0.9),
        "floor_p50_s": FLOOR_P50_S, "floor_met": p50 is not None and p50 <= FLOOR_P50_S,
        "per_trial": [{"question": t.question, "heard": t.heard.strip(), "latency_s": t.latency_s(),
                       "timeline_s": t.timeline_s(), "delegation_tick": t.delegation_tick,
                       "placed_tick": t.placed_tick, "onset_tick": t.onset_tick(), "said_before": t.said_before(),
                       "errors": t.errors} for t in trials],
        "note": "from session.delegation.created received to the commentary's first non-silent output audio "
                "delta received; quantiles by nearest rank over the trials that measured one",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live_delegation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10, help="sessions, one hand-off each (default 10)")
    ap.add_argument("--pace", choices=["realtime", "media"], default="realtime",
                    help="realtime (default): the wall clock; media: each micro-turn as soon as the last is answered")
    ap.add_argument("--url", default=None,
                    help="a running server, ws://HOST:PORT or http://HOST:PORT (serving the cascade)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one trial may take (default 120)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    if args.trials < 1:
        ap.error("--trials must be at least 1")
    print("[bench.live_delegation] synthesizing the questions ...", file=sys.stderr, flush=True)
    speech = _speak([q for q, _ in LOOKUPS[: args.trials]])  # only the questions the trials ask
    server = (local_server("--model", "cascade", "--background", "none", "--max-sessions", "2", ready_timeout=600.0)
              if args.url is None else nullcontext(args.url))
    with server as base:
        url = base.replace("http", "ws", 1).rstrip("/") + live_client.PATH
        trials = asyncio.run(_run(url, args.trials, args.pace, args.timeout, speech))
    report = summarize(trials, args.pace)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'pace':>8} {'trials':>6} {'handed off':>10} {'measured':>8} {'p50 s':>7} {'p90 s':>7} {'max s':>7} "
              f"{'timeline p50/p90 s':>19} {'floor p50<=0.6':>15}")
        tl = f"{report['timeline_s_p50']}/{report['timeline_s_p90']}"
        print(f"{args.pace:>8} {report['trials']:>6} {report['handed_off']:>10} {report['measured']:>8} "
              f"{report['latency_s_p50']!s:>7} {report['latency_s_p90']!s:>7} {report['latency_s_max']!s:>7} "
              f"{tl:>19} {'met' if report['floor_met'] else 'NOT met':>15}")
    return 0 if report["measured"] else 1


if __name__ == "__main__":
    sys.exit(main())
