"""python -m bench.load: N concurrent real-time sessions streaming speech against a running server.

Each session sends 200 ms of PCM16 every 200 ms on absolute deadlines (raw binary frames, the cheap
path, so the load generator steals as little CPU as possible from the server it shares the machine
with) for M seconds. Before and after, the server's /metrics are read: the difference gives the tick
lateness distribution, missed deadlines, underruns and dropped input of exactly this run; server
memory comes from its process metrics (and /proc/PID when the server runs on this machine).

`--video JPEG` adds a camera: every session also sends that picture as a `duplex.input_video.append`
frame every micro-turn (5 a second, the bound), so perception's cost is in the measurement.

`--find-max` repeats bounded trials (1, 2, 4, ... sessions, then bisection) to find the largest N
with zero missed deadlines and no errors.

$DUPLEX_API_KEY is sent as the bearer key when set. Loopback only: the target must be 127.0.0.0/8,
localhost or ::1. Every loop is bounded in count and time.
"""

import argparse
import asyncio
import base64
import ipaddress
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.wsclient import auth_headers, open_session, set_session
from streaming.pcm import float32_to_pcm16
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, TICK_SECONDS, Audio

MAX_SESSIONS = 512  # hard bound on one trial
MAX_SECONDS = 600.0  # hard bound on one trial's streaming time
MAX_TRIALS = 16  # hard bound on --find-max


def check_loopback(url: str) -> str:
    """The host of `url`, or ValueError when it is not a loopback address."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return host
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise ValueError(f"bench.load only targets this machine (127.0.0.0/8, localhost, ::1); got host {host!r}")


def http_base(ws_url: str) -> str:
    parts = urlsplit(ws_url)
    return f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}"


# --- /metrics -------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    missed: float = 0.0
    dropped: float = 0.0
    underruns: float = 0.0
    ticks_realtime: float = 0.0
    lateness_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    lateness_count: float = 0.0
    lateness_sum: float = 0.0
    rss_bytes: float | None = None


def parse_metrics(text: str) -> Snapshot:
    from prometheus_client.parser import text_string_to_metric_families

    snap = Snapshot()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "duplex_missed_deadlines_total":
                snap.missed += s.value
            elif s.name == "duplex_input_dropped_samples_total":
                snap.dropped += s.value
            elif s.name == "duplex_input_underruns_total":
                snap.underruns += s.value
            elif s.name == "duplex_ticks_total" and s.labels.get("pace") == "realtime":
                snap.ticks_realtime += s.value
            elif s.name == "duplex_tick_lateness_seconds_bucket":
                le = float(s.labels["le"])
                snap.lateness_buckets[le] = snap.lateness_buckets.get(le, 0.0) + s.value
            elif s.name == "duplex_tick_lateness_seconds_count":
                snap.lateness_count += s.value
            elif s.name == "duplex_tick_lateness_seconds_sum":
                snap.lateness_sum += s.value
            elif s.name == "process_resident_memory_bytes":
                snap.rss_bytes = s.value
    return snap


def bucket_quantile(buckets: dict[float, float], q: float) -> float | None:
    """Quantile from cumulative histogram buckets, linear within a bucket (as PromQL does)."""
    items = sorted(buckets.items())
    if not items or items[-1][1] <= 0:
        return None
    rank = q * items[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in items:
        if count >= rank:
            if le == float("inf"):
                return prev_le  # beyond the largest finite bucket: report its bound
            width = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / width if width > 0 else 1.0)
        prev_le, prev_count = le, count
    return items[-1][0]


def _get(url: str) -> Any:
    import httpx

    return httpx.get(url, timeout=10.0, headers=auth_headers())


def snapshot(base: str) -> Snapshot:
    resp = _get(base + "/metrics")
    if resp.status_code != 200:
        raise RuntimeError(f"{base}/metrics answered {resp.status_code}; is this a duplex server?")
    return parse_metrics(resp.text)


def server_pid(base: str) -> int | None:
    try:
        pid = _get(base + "/healthz").json().get("pid")
        return int(pid) if pid is not None else None
    except Exception:  # no pid is fine: memory then comes from process metrics alone
        return None


def proc_rss(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# --- sessions -------------------------------------------------------------------------------------


@dataclass
class SessionStats:
    sent: int = 0  # micro-turns sent
    deltas: int = 0  # audio deltas received
    errors: list[str] = field(default_factory=list)
    refused: bool = False  # closed with 1013 (server full)
    late_sends: int = 0  # our own sends more than one micro-turn behind schedule (client overloaded)


async def _session(url: str, speech: Audio, seconds: float, offset: float, stats: SessionStats,
                   video: str | None = None) -> None:
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    await asyncio.sleep(offset)
    n_ticks = int(seconds / TICK_SECONDS)
    frames = [
        float32_to_pcm16(speech[(i * TICK_SAMPLES) % len(speech) :][:TICK_SAMPLES])
        for i in range(max(1, len(speech) // TICK_SAMPLES))
    ]
    try:
        async with open_session(url) as ws:
            await set_session(ws, pace="realtime")

            async def receive() -> None:
                async for raw in ws:
                    if isinstance(raw, bytes):
                        continue
                    # Cheap checks: full JSON decoding of every delta would load the shared CPU.
                    if '"response.output_audio.delta"' in raw:
                        stats.deltas += 1
                    elif '"type": "error"' in raw or '"type":"error"' in raw:
                        stats.errors.append(json.loads(raw).get("error", {}).get("message", raw[:200]))

            receiver = asyncio.create_task(receive())
            t0 = time.monotonic()
            try:
                for i in range(n_ticks):
                    delay = t0 + i * TICK_SECONDS - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    elif delay < -TICK_SECONDS:
                        stats.late_sends += 1
                    await ws.send(frames[i % len(frames)])
                    if video is not None:
                        await ws.send(video)
                    stats.sent += 1
                await asyncio.sleep(0.5)  # let the last micro-turns come back
            finally:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
    except InvalidStatus as e:
        stats.errors.append(f"handshake refused: HTTP {e.response.status_code}")
    except ConnectionClosed as e:
        if e.rcvd is not None and e.rcvd.code == 1013:
            stats.refused = True
        stats.errors.append(f"closed {e.rcvd.code if e.rcvd else '?'}: {e.rcvd.reason if e.rcvd else ''}")
    except OSError as e:
        stats.errors.append(f"connect failed: {e}")


@dataclass
class TrialResult:
    sessions: int
    seconds: float
    ticks_realtime: int
    missed_deadlines: int
    dropped_samples: int
    underruns: int
    lateness_p50_ms: float | None
    lateness_p95_ms: float | None
    lateness_p99_ms: float | None
    lateness_mean_ms: float | None
    rss_before_mb: float | None
    rss_after_mb: float | None
    refused: int
    errors: int
    client_late_sends: int
    deltas_received: int
    error_samples: list[str]

    @property
    def clean(self) -> bool:
        return self.missed_deadlines == 0 and self.errors == 0 and self.refused == 0


def trial(url: str, sessions: int, seconds: float, speech: Audio, ramp: float = 1.0,
          video: str | None = None) -> TrialResult:
    """One bounded run of `sessions` concurrent real-time sessions for `seconds`."""
    check_loopback(url)
    if not 1 <= sessions <= MAX_SESSIONS:
        raise ValueError(f"--sessions must be within 1..{MAX_SESSIONS}, got {sessions}")
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"--seconds must be within (0, {MAX_SECONDS:.0f}], got {seconds}")
    base = http_base(url)
    pid = server_pid(base)
    before = snapshot(base)
    rss_before = proc_rss(pid) or before.rss_bytes
    stats = [SessionStats() for _ in range(sessions)]

    async def all_sessions() -> None:
        # Stagger starts over `ramp` seconds so phases spread like real clients'.
        await asyncio.gather(*(_session(url, speech, seconds, ramp * i / sessions, st, video)
                               for i, st in enumerate(stats)))

    asyncio.run(asyncio.wait_for(all_sessions(), seconds + ramp + 60))
    after = snapshot(base)
    rss_after = proc_rss(pid) or after.rss_bytes
    buckets = {
        le: after.lateness_buckets.get(le, 0.0) - before.lateness_buckets.get(le, 0.0) for le in after.lateness_buckets
    }
    count = after.lateness_count - before.lateness_count
    q = lambda p: None if (v := bucket_quantile(buckets, p)) is None else round(v * 1000, 2)  # noqa: E731
    errors = [e for st in stats for e in st.errors]
    return TrialResult(
        sessions=sessions,
        seconds=seconds,
        ticks_realtime=int(after.ticks_realtime - before.ticks_realtime),
        missed_deadlines=int(after.missed - before.missed),
        dropped_samples=int(after.dropped - before.dropped),
        underruns=int(after.underruns - before.underruns),
        lateness_p50_ms=q(0.5),
        lateness_p95_ms=q(0.95),
        lateness_p99_ms=q(0.99),
        lateness_mean_ms=round((after.lateness_sum - before.lateness_sum) / count * 1000, 2) if count else None,
        rss_before_mb=round(rss_before / 2**20, 1) if rss_before else None,
        rss_after_mb=round(rss_after / 2**20, 1) if rss_after else None,
        refused=sum(st.refused for st in stats),
        errors=len(errors),
        client_late_sends=sum(st.late_sends for st in stats),
        deltas_received=sum(st.deltas for st in stats),
        error_samples=errors[:5],
    )


def find_max(url: str, seconds: float, speech: Audio, limit: int, progress: bool = True,
             video: str | None = None) -> list[TrialResult]:
    """Double N until a trial misses a deadline (or errs), then bisect; at most MAX_TRIALS trials."""
    trials: list[TrialResult] = []

    def run(n: int) -> bool:
        if len(trials) >= MAX_TRIALS:
            raise RuntimeError(f"--find-max stopped after {MAX_TRIALS} trials")
        res = trial(url, n, seconds, speech, video=video)
        trials.append(res)
        if progress:
            print(
                f"  N={n}: missed={res.missed_deadlines} errors={res.errors} refused={res.refused} "
                f"p99 lateness={res.lateness_p99_ms} ms",
                file=sys.stderr,
                flush=True,
            )
        return res.clean

    good, bad, n = 0, None, 1
    while n <= limit and bad is None:
        if run(n):
            good, n = n, n * 2
        else:
            bad = n
    if bad is None and good < limit:  # every doubling was clean: try the limit itself
        if run(limit):
            good = limit
        else:
            bad = limit
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if run(mid):
            good = mid
        else:
            bad = mid
    return trials


def speech_clip(wav: Path | None) -> Audio:
    """The speech each session streams: a wav file, or a few sentences from the project TTS."""
    if wav is not None:
        from streaming.wav import read_wav

        audio, _ = read_wav(wav, rate=SAMPLE_RATE)
        return audio
    from models.speech.tts import synthesize
    from streaming.resample import resample

    audio, sr = synthesize(
        "Hello there. I would like to know what the weather will be like tomorrow, "
        "and whether I should bring an umbrella to work."
    )
    return resample(audio, sr, SAMPLE_RATE)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", required=True, help="ws://127.0.0.1:PORT/v1/realtime (loopback only)")
    p.add_argument("--sessions", type=int, default=1, help="concurrent sessions (one trial)")
    p.add_argument("--seconds", type=float, default=20.0, help="streaming time per trial")
    p.add_argument("--wav", type=Path, help="speech to stream (default: a TTS sentence)")
    p.add_argument("--find-max", action="store_true", help="search the largest N with zero missed deadlines")
    p.add_argument("--limit", type=int, default=64, help="largest N --find-max tries (default 64)")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--video", type=Path, help="a JPEG every session also sends as its camera, 5 frames a second")
    args = p.parse_args(argv)
    try:
        check_loopback(args.url)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    speech = speech_clip(args.wav)
    video = None
    if args.video is not None:
        image = base64.b64encode(args.video.read_bytes()).decode("ascii")
        video = json.dumps({"type": "duplex.input_video.append", "image": image})
    if args.find_max:
        trials = find_max(args.url, args.seconds, speech, min(args.limit, MAX_SESSIONS), video=video)
        best = max((t.sessions for t in trials if t.clean), default=0)
        if args.json:
            print(json.dumps({"max_sessions_zero_missed": best, "trials": [asdict(t) for t in trials]}, indent=2))
        else:
            for t in trials:
                print(_line(t))
            print(f"largest N with zero missed deadlines and no errors: {best}")
        return 0 if best > 0 else 1
    res = trial(args.url, args.sessions, args.seconds, speech, video=video)
    print(json.dumps(asdict(res), indent=2) if args.json else _line(res))
    return 0 if res.clean else 1


def _line(t: TrialResult) -> str:
    return (
        f"N={t.sessions} {t.seconds:.0f}s: ticks={t.ticks_realtime} missed={t.missed_deadlines} "
        f"lateness p50/p95/p99={t.lateness_p50_ms}/{t.lateness_p95_ms}/{t.lateness_p99_ms} ms "
        f"(mean {t.lateness_mean_ms}) dropped={t.dropped_samples} underruns={t.underruns} "
        f"rss {t.rss_before_mb}->{t.rss_after_mb} MB errors={t.errors} refused={t.refused} "
        f"client-late-sends={t.client_late_sends}"
    )


if __name__ == "__main__":
    sys.exit(main())
