"""`run`: stream every sample's input through the server and write `output.wav` beside it.

Outputs are 16 kHz mono PCM16, exactly as long as the input and on its timeline (sample k of the
output is what the model was saying while sample k of the input was heard). v1.5 samples also get
`clean_output.wav` from `clean_input.wav`. In real-time pace the tick placement is `output.wav` and
the wall-clock placement `output_wallclock.wav`. `output.events.json` (and `clean_output.events.json`)
logs what the model heard, decided and said (`client.LOGGED`), each event at the input time its
micro-turn's output is heard from. A summary (model, pace, failures, delta lateness)
goes to `run.json` at the data root.

`protocol="live"` streams through GPT-Live (`/v1/live/sessions`, bench/fdbench/live_client.py)
instead of Realtime, into the same layout, so every figure can be measured through either.
"""

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from tqdm import tqdm

from bench.fdbench import live_client
from bench.fdbench.client import ClientError, StreamResult, stream
from bench.fdbench.layout import RUN_INFO, Sample, find_samples
from bench.fdbench.lockstep import Lockstep
from bench.wsclient import auth_headers
from streaming.resample import resample
from streaming.types import SAMPLE_RATE
from streaming.wav import read_wav, write_wav

OUT_RATE = 16_000
PROTOCOLS = ("realtime", "live")
PATHS = {"realtime": "/v1/realtime", "live": live_client.PATH}


@dataclass
class RunSummary:
    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # sample name -> why
    server_errors: dict[str, list[str]] = field(default_factory=dict)  # `error` events, per sample
    lateness: list[float] = field(default_factory=list)  # real-time: delta arrival - earliest play time
    underruns: int = 0  # real-time: micro-turns stepped before their chunk arrived (left out of output.wav)


def http_base(ws_url: str) -> str:
    parts = urlsplit(ws_url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return f"{scheme}://{parts.netloc}"


def check_url(url: str, protocol: str) -> None:
    """A WebSocket URL whose path is `protocol`'s (a Realtime URL given for a live run is a mistake to
    say, not to stream into)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if not url.startswith(("ws://", "wss://")):
        raise ValueError(f"--url must be a WebSocket URL like ws://127.0.0.1:8000{PATHS[protocol]}, got {url!r}")
    path = urlsplit(url).path.rstrip("/")
    for other, other_path in PATHS.items():
        if other != protocol and path.endswith(other_path):
            raise ValueError(f"--url {url} is the {other} endpoint but --protocol is {protocol}; use "
                             f"ws://{urlsplit(url).netloc}{PATHS[protocol]}")


def server_info(ws_url: str) -> dict[str, Any]:
    """What /healthz says about the server (model name...), or {} when it says nothing useful."""
    import httpx

    try:
        resp = httpx.get(http_base(ws_url) + "/healthz", timeout=5.0, headers=auth_headers())
        data = resp.json()
        return data if isinstance(data, dict) else {}
    except (httpx.HTTPError, ValueError):
        return {}


async def _stream(url: str, audio: np.ndarray, pace: str, timeout: float, protocol: str,
                  lockstep: tuple[Lockstep, int] | None) -> StreamResult:
    if protocol == "live":
        return await live_client.stream(url, audio, pace=pace, timeout=timeout)
    return await stream(url, audio, pace=pace, timeout=timeout, lockstep=lockstep)


async def _one(sample: Sample, url: str, pace: str, timeout: float, summary: RunSummary,
               lockstep: tuple[Lockstep, int] | None = None, protocol: str = "realtime") -> None:
    pairs = [("input.wav", "output")]
    if sample.kind == "overlap":
        pairs.append(("clean_input.wav", "clean_output"))
    for input_name, output_stem in pairs:
        path = sample.file(input_name)
        if not path.exists():
            summary.failed[sample.name] = f"missing {input_name}; regenerate the sample"
            return
        try:
            audio, rate = read_wav(path)
        except Exception as e:  # soundfile raises several types for broken files
            summary.failed[sample.name] = f"{input_name} is not a readable wav ({e})"
            return
        try:
            result = await _stream(url, resample(audio, rate, SAMPLE_RATE), pace, timeout, protocol, lockstep)
        except ClientError as e:
            summary.failed[sample.name] = str(e)
            return
        n_out = round(len(audio) * OUT_RATE / rate)
        n_24k = round(len(audio) * SAMPLE_RATE / rate)
        _write(sample.file(f"{output_stem}.wav"), result.tick_placement(n_24k), n_out)
        log = ",\n ".join(json.dumps(e) for e in result.event_log())  # one event a line
        sample.file(f"{output_stem}.events.json").write_text(f"[{log}]\n", encoding="utf-8")
        if pace == "realtime":
            _write(sample.file(f"{output_stem}_wallclock.wav"), result.arrival_placement(n_24k), n_out)
            summary.lateness.extend(result.lateness())
            summary.underruns += len(result.underruns())
        if result.errors:
            summary.server_errors.setdefault(sample.name, []).extend(result.errors)
    summary.done.append(sample.name)


def _write(path: Path, audio_24k: np.ndarray, n_out: int) -> None:
    out = resample(audio_24k.astype(np.float32), SAMPLE_RATE, OUT_RATE)
    out = out[:n_out] if len(out) >= n_out else np.concatenate([out, np.zeros(n_out - len(out), np.float32)])
    write_wav(path, out, OUT_RATE)


async def _run_all(
    samples: list[Sample], url: str, pace: str, concurrency: int, timeout: float, summary: RunSummary,
    protocol: str = "realtime",
) -> None:
    todo = deque(samples)
    bar = tqdm(total=len(samples), desc=f"run ({protocol}, {pace})", unit="sample")
    # Media pace: the slots' sessions step on one shared clock, as real time's do (lockstep.py).
    # GPT-Live has no media clock to share: run() allows it one slot only in media pace.
    lock = Lockstep(concurrency) if pace == "media" and protocol == "realtime" else None

    async def slot(i: int) -> None:
        try:
            while todo:
                await _one(todo.popleft(), url, pace, timeout, summary, (lock, i) if lock is not None else None,
                           protocol)
                bar.update(1)
                if summary.failed:
                    bar.set_postfix(failed=len(summary.failed))
        finally:
            if lock is not None:
                await lock.retire(i)

    try:
        await asyncio.gather(*(slot(i) for i in range(concurrency)))
    finally:
        bar.close()


def run(
    data: Path,
    url: str,
    pace: str = "media",
    concurrency: int = 1,
    timeout: float = 300.0,
    label: str | None = None,
    skip_existing: bool = False,
    protocol: str = "realtime",
) -> RunSummary:
    check_url(url, protocol)
    if concurrency < 1:
        raise ValueError("--concurrency must be >= 1")
    if protocol == "live" and pace == "media" and concurrency > 1:
        raise ValueError("--protocol live runs media pace one sample at a time: GPT-Live has no "
                         "session.duplex.media_clock to keep sessions in lockstep; use --concurrency 1, "
                         "or --pace realtime for several sessions at once")
    samples = [s for s in find_samples(data) if s.kind != "unknown"]
    if skip_existing:
        samples = [s for s in samples if not s.file("output.wav").exists()]
    info = server_info(url)
    summary = RunSummary()
    started = time.time()
    asyncio.run(_run_all(samples, url, pace, concurrency, timeout, summary, protocol))
    lat = np.asarray(summary.lateness)
    record = {
        "label": label or str(info.get("model", "duplex")),
        "model": info.get("model"),
        "url": url,
        "pace": pace,
        "protocol": protocol,
        "started": started,
        "seconds": round(time.time() - started, 1),
        "samples": len(summary.done),
        "failed": summary.failed,
        "server_errors": {k: v[:5] for k, v in summary.server_errors.items()},
        "underruns": summary.underruns if pace == "realtime" else None,
        "delta_lateness_s": (
            {
                "mean": float(lat.mean()),
                "p50": float(np.percentile(lat, 50)),
                "p95": float(np.percentile(lat, 95)),
                "max": float(lat.max()),
            }
            if len(lat)
            else None
        ),
    }
    (Path(data) / RUN_INFO).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return summary
