"""Mouth-to-ear latency of the WebRTC path over loopback, with the echo model.

    python -m bench.webrtc_latency [--json] [--url http://127.0.0.1:8000 --model-delay 1] [--bursts 40]

A real aiortc client peer sends distinct bursts of band-limited noise as its microphone (Opus, paced
20 ms frames) and records what comes back on the server's output track. For each burst, the time it
was "spoken" (the sender's schedule) and the time it was heard (arrival of the decoded frames at the
client) are found by normalised cross-correlation. The echo model returns its input N micro-turns
later; that delay is the model's own and is subtracted:

    mouth_to_ear      everything, as a person would measure it with this client
    minus_model       mouth_to_ear - N * 200 ms: what the server and transport add (the asked figure);
                      it includes one micro-turn (200 ms) of input framing, inherent to 200 ms steps
    over_framing      minus_model - 200 ms: what WebRTC, scheduling, pacing and codecs add on top

Without --url a server is started on a free loopback port (`--model echo:N --background none`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np
from scipy import signal as sps

from bench._rtc_client import RATE, RtcClient
from bench._server import local_server
from streaming.types import TICK_SECONDS, Audio

MIN_CORRELATION = 0.5  # a burst whose best normalised correlation is below this counts as lost
GLITCH_CORRELATION = 0.9  # a burst found below this had a gap or a jump inside it


@dataclass
class Result:
    model_delay_ms: float
    bursts_sent: int
    bursts_found: int
    mouth_to_ear_p50_ms: float
    mouth_to_ear_p99_ms: float
    minus_model_p50_ms: float
    minus_model_p99_ms: float
    over_framing_p50_ms: float
    over_framing_p99_ms: float
    min_correlation: float
    glitched_bursts: int  # found, but with a gap inside (correlation below GLITCH_CORRELATION)
    latencies_ms: list[float]


def make_bursts(count: int, burst_s: float, spacing_s: float, seed: int = 0) -> tuple[Audio, list[int]]:
    """`count` distinct noise bursts (300-3400 Hz, speech band) every `spacing_s`; returns audio and onsets."""
    rng = np.random.default_rng(seed)
    sos = sps.butter(6, [300, 3400], btype="bandpass", fs=RATE, output="sos")
    n_burst, n_space = int(burst_s * RATE), int(spacing_s * RATE)
    audio = np.zeros(count * n_space, np.float32)
    onsets = []
    ramp = np.minimum(1.0, np.minimum(np.arange(n_burst), np.arange(n_burst)[::-1]) / (0.005 * RATE))
    for b in range(count):
        burst = sps.sosfilt(sos, rng.standard_normal(n_burst + 2000))[2000:]  # skip the filter's start-up
        burst = 0.3 * burst / np.max(np.abs(burst)) * ramp
        start = b * n_space + n_space // 4
        audio[start : start + n_burst] = burst
        onsets.append(start)
    return audio, onsets


def find(template: Audio, received: Audio, lo: int, hi: int) -> tuple[int, float]:
    """Best match of `template` in received[lo:hi + len(template)]: (start index, normalised correlation)."""
    seg = received[max(0, lo) : min(len(received), hi + len(template))]
    if len(seg) < len(template):
        return -1, 0.0
    corr = sps.correlate(seg, template, mode="valid", method="fft")
    energy = np.sqrt(np.maximum(np.convolve(seg**2, np.ones(len(template)), mode="valid"), 1e-12))
    norm = corr / (energy * np.linalg.norm(template))
    k = int(np.argmax(norm))
    return max(0, lo) + k, float(norm[k])


def measure(
    client: RtcClient, sent_start: int, onsets: list[int], bursts: list[Audio], max_latency_s: float
) -> tuple[list[float], list[float]]:
    """Latency (s) and normalised correlation of every burst found."""
    received, ear = client.received.signal()
    latencies: list[float] = []
    scores: list[float] = []
    for onset, tmpl in zip(onsets, bursts, strict=True):
        mouth = client.mic.mouth_time(sent_start + onset)
        if np.isnan(mouth):
            continue
        window = np.nonzero((ear >= mouth) & (ear <= mouth + max_latency_s))[0]
        if len(window) == 0:
            continue
        j, score = find(tmpl, received, int(window[0]), int(window[-1]))
        if j < 0 or score < MIN_CORRELATION:
            continue
        latencies.append(float(ear[j] - mouth))
        scores.append(score)
    return latencies, scores


async def run(
    url: str, model_delay: int, count: int, burst_s: float, spacing_s: float, api_key: str | None = None
) -> Result:
    client = RtcClient(url, api_key=api_key)
    await client.connect()
    try:
        await client.wait_for("session.created")
        await asyncio.sleep(0.5)  # let both pacers and jitter buffers settle
        audio, onsets = make_bursts(count, burst_s, spacing_s)
        n_burst = int(burst_s * RATE)
        templates = [audio[o : o + n_burst] for o in onsets]
        sent_start = client.mic.play(audio)
        max_latency = model_delay * TICK_SECONDS + 1.5
        await asyncio.sleep(len(audio) / RATE + max_latency)
    finally:
        await client.hangup()
        await client.close()
    # After hanging up: the correlations take seconds of CPU, which would stall this peer's event loop
    # (and a peer that stops sending is, rightly, declared dead by the server).
    latencies, scores = measure(client, sent_start, onsets, templates, max_latency)
    if not latencies:
        raise RuntimeError("no burst came back: is the server running the echo model?")
    worst = min(scores)
    # A clean echo correlates at ~0.98 after two Opus passes; a burst well below that had a gap in it.
    glitched = sum(1 for s in scores if s < GLITCH_CORRELATION)
    ms = np.asarray(latencies) * 1000
    model_ms = model_delay * TICK_SECONDS * 1000
    framing_ms = TICK_SECONDS * 1000

    def pct(x: np.ndarray, q: float) -> float:
        return round(float(np.percentile(x, q)), 1)

    return Result(
        model_delay_ms=model_ms,
        bursts_sent=count,
        bursts_found=len(latencies),
        mouth_to_ear_p50_ms=pct(ms, 50),
        mouth_to_ear_p99_ms=pct(ms, 99),
        minus_model_p50_ms=pct(ms - model_ms, 50),
        minus_model_p99_ms=pct(ms - model_ms, 99),
        over_framing_p50_ms=pct(ms - model_ms - framing_ms, 50),
        over_framing_p99_ms=pct(ms - model_ms - framing_ms, 99),
        min_correlation=round(worst, 3),
        glitched_bursts=glitched,
        latencies_ms=[round(float(x), 1) for x in ms],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.webrtc_latency", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", help="a running server (on the echo model); default: start one")
    ap.add_argument("--model-delay", type=int, default=1, help="the echo model's delay in micro-turns")
    ap.add_argument("--bursts", type=int, default=40, help="bursts sent (one latency sample each)")
    ap.add_argument("--burst-ms", type=float, default=200.0)
    ap.add_argument("--spacing-ms", type=float, default=500.0)
    ap.add_argument("--api-key", default=os.environ.get("DUPLEX_API_KEY"))
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    server_args = ("--model", f"echo:{args.model_delay}", "--background", "none")
    with local_server(*server_args, ready_timeout=60.0) if args.url is None else nullcontext(args.url) as url:
        result = asyncio.run(
            run(url, args.model_delay, args.bursts, args.burst_ms / 1000, args.spacing_ms / 1000, args.api_key)
        )
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        r = result
        print(f"bursts found {r.bursts_found}/{r.bursts_sent}, {r.glitched_bursts} with a gap inside "
              f"(lowest correlation {r.min_correlation})")
        print(f"mouth-to-ear        p50 {r.mouth_to_ear_p50_ms:7.1f} ms   p99 {r.mouth_to_ear_p99_ms:7.1f} ms")
        print(
            f"minus model ({r.model_delay_ms:.0f} ms) p50 {r.minus_model_p50_ms:7.1f} ms   "
            f"p99 {r.minus_model_p99_ms:7.1f} ms"
        )
        print(f"over 200 ms framing p50 {r.over_framing_p50_ms:7.1f} ms   p99 {r.over_framing_p99_ms:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
