"""A real-time client of the echo model that checks every echo: the witness of the reliability benches.

It sends 200 ms of unique random PCM16 at absolute deadlines (as a microphone would) and matches each
`response.output_audio.delta` to the chunk it echoes, so it knows for every chunk whether it came back
and how long the server added (`arrival - send - delay * 200 ms`, as bench.latency measures). It keeps
what the server said when it closed the session (`duplex.session.closing` and the close code), and can
drop its connection without a close and resume with its token, as a client on a flaky network does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bench.wsclient import open_session, opening, set_session

TICK_SAMPLES = 4800
PERIOD = 0.2  # seconds per micro-turn
DROP_EXEMPT = 1.0  # chunks sent this close before a deliberate drop may be lost with the connection


@dataclass
class EchoStats:
    sent: int = 0
    returned: int = 0
    late: int = 0  # came back later than `late_after` past its due time
    missed: int = 0  # never came back (counted at the end)
    exempt: int = 0  # sent just before a deliberate drop: not counted as missed
    max_added_ms: float = 0.0
    added_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # error events from the server
    closing: list[dict[str, Any]] = field(default_factory=list)  # duplex.session.closing events
    close_codes: list[int | None] = field(default_factory=list)  # close codes of server-closed connections
    unexpected_drops: int = 0  # the connection ended without our asking and without a closing event
    resumes: int = 0
    resume_failures: list[str] = field(default_factory=list)
    refused: bool = False  # server full (1013) at connect
    transcripts: list[str] = field(default_factory=list)  # text the echo model said (typed input comes back)
    late_at: list[tuple[float, float]] = field(default_factory=list)  # (wall time of arrival, added ms) of late echoes


class EchoClient:
    """One real-time session against an echo:`delay` server; `run()` streams until `stop` is set."""

    def __init__(self, ws_url: str, seed: int, delay: int = 1, late_after: float = 0.2,
                 headers: dict[str, str] | None = None, speech: np.ndarray | None = None) -> None:
        self.ws_url = ws_url
        # Other models than echo: stream this int16 speech in a loop and only count audio deltas
        # (their output is not an echo to match); the server's missed deadlines are the check then.
        self.speech = speech
        self._speech_pos = 0
        self.deltas = 0
        self.events: list[dict[str, Any]] = []  # every event but audio deltas, in arrival order
        self.delay = delay
        self.late_after = late_after
        self.headers = headers or {}
        self.rng = np.random.default_rng(seed)
        self.stats = EchoStats()
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.stop = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._sent: dict[bytes, tuple[int, float]] = {}  # chunk -> (index, monotonic send time)
        self._pending: set[int] = set()  # chunk indexes not echoed yet
        self._exempt: set[int] = set()
        self._reader: asyncio.Task[None] | None = None
        self._closing_seen = asyncio.Event()
        self._dropping = False

    # -- connection ---------------------------------------------------------------------------

    async def connect(self, resume: bool = False) -> bool:
        try:
            ws = await open_session(self.ws_url, self.resume_token if resume else None, self.headers)
        except InvalidStatus as exc:
            self.stats.errors.append(f"handshake refused: HTTP {exc.response.status_code}")
            return False
        except OSError as exc:
            self.stats.errors.append(f"connect failed: {exc}")
            return False
        try:
            first, hello = await opening(ws)
        except (ConnectionClosed, TimeoutError) as exc:
            self.stats.errors.append(f"no session.created: {exc!r}")
            return False
        if hello is None:  # refused: an error instead of session.created
            code = first.get("error", {}).get("code")
            self.stats.refused = code == "server_full"
            if resume:
                self.stats.resume_failures.append(str(code))
            await ws.close()
            return False
        if resume:
            if not hello.get("resumed") or hello.get("session_id") != self.session_id:
                self.stats.resume_failures.append(f"resumed={hello.get('resumed')} id={hello.get('session_id')}")
            self.stats.resumes += 1
        self.session_id = hello.get("session_id")
        self.resume_token = hello.get("resume_token")
        if not resume:
            await set_session(ws, pace="realtime")
        self._ws = ws
        self._dropping = False
        self._reader = asyncio.create_task(self._read(ws))
        return True

    async def _read(self, ws: ClientConnection) -> None:
        try:
            async for msg in ws:
                if isinstance(msg, bytes):
                    continue
                self._on_event(json.loads(msg))
        except ConnectionClosed:
            pass
        rcvd = ws.protocol.close_rcvd
        if not self._dropping:
            self.stats.close_codes.append(rcvd.code if rcvd is not None else None)
            if not self._closing_seen.is_set() and (rcvd is None or rcvd.code != 1000):
                self.stats.unexpected_drops += 1

    def _on_event(self, ev: dict[str, Any]) -> None:
        etype = ev.get("type")
        if etype in ("response.output_audio.delta", "response.audio.delta"):
            self.deltas += 1
            hit = self._sent.pop(base64.b64decode(ev["delta"]), None)  # echoed chunks are forgotten: bounded
            if hit is not None and hit[0] in self._pending:
                k, sent_at = hit
                self._pending.discard(k)
                self.stats.returned += 1
                added = (time.monotonic() - sent_at - self.delay * PERIOD) * 1000
                if k not in self._exempt:
                    self.stats.added_ms.append(added)
                    self.stats.max_added_ms = max(self.stats.max_added_ms, added)
                    if added > self.late_after * 1000:
                        self.stats.late += 1
                        self.stats.late_at.append((time.time(), round(added, 1)))
            return
        self.events.append(ev)
        if etype == "response.output_audio_transcript.delta":
            self.stats.transcripts.append(str(ev.get("delta", "")))
        elif etype == "error":
            err = ev.get("error", {})
            self.stats.errors.append(f"{err.get('code')}: {err.get('message')}")
        elif etype == "duplex.session.closing":
            self.stats.closing.append(ev)
            self._closing_seen.set()

    async def wait_event(self, pred: Any, timeout: float, start: int = 0) -> dict[str, Any] | None:
        """The first event from index `start` on for which `pred(event)` holds, waiting up to `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            for ev in self.events[start:]:
                if pred(ev):
                    return ev
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.02)

    @property
    def connected(self) -> bool:
        return self._ws is not None and self._reader is not None and not self._reader.done()

    async def send_event(self, event: dict[str, Any]) -> None:
        if self._ws is not None:
            await self._ws.send(json.dumps(event))

    async def drop(self) -> None:
        """Vanish without a close frame (TCP abort), as a client whose network went away."""
        now = time.monotonic()
        self._exempt |= {k for k, t in self._sent.values() if now - t < DROP_EXEMPT + self.delay * PERIOD}
        self._dropping = True
        if self._ws is not None:
            self._ws.transport.abort()
        await self._stop_reader()

    async def leave(self) -> None:
        """Close with 1000: the session ends at once."""
        self._dropping = True
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(1000), 5)
        await self._stop_reader()

    async def _stop_reader(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        self._ws = None

    # -- streaming ----------------------------------------------------------------------------

    def _chunk(self) -> bytes:
        if self.speech is not None and len(self.speech) >= TICK_SAMPLES:
            if self._speech_pos + TICK_SAMPLES > len(self.speech):
                self._speech_pos = 0
            self._speech_pos += TICK_SAMPLES
            return self.speech[self._speech_pos - TICK_SAMPLES:self._speech_pos].astype("<i2").tobytes()
        x = self.rng.integers(-20000, 20000, TICK_SAMPLES).astype("<i2")
        x[x == 0] = 1  # never silence: the echo of every chunk is sent
        return x.tobytes()

    async def stream(self, seconds: float | None = None) -> None:
        """Send one chunk per micro-turn at absolute deadlines until `stop` (or `seconds`) while connected."""
        t0 = time.monotonic()
        k = 0
        while not self.stop.is_set() and (seconds is None or k * PERIOD < seconds):
            due = t0 + (k + 1) * PERIOD  # the chunk's last sample exists now
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            ws = self._ws
            if ws is None or not self.connected:
                return
            chunk = self._chunk()
            index = self.stats.sent
            if self.speech is None:
                self._sent[chunk] = (index, time.monotonic())
                self._pending.add(index)
            try:
                await ws.send(chunk)
            except ConnectionClosed:
                return
            self.stats.sent += 1
            k += 1

    async def settle(self, wait: float = 1.0) -> None:
        """Wait for the last echoes, then count what never came back."""
        deadline = time.monotonic() + wait + self.delay * PERIOD
        while self._pending - self._exempt and time.monotonic() < deadline and self.connected:
            await asyncio.sleep(0.05)
        missing = self._pending - self._exempt
        self.stats.missed = len(missing)
        self.stats.exempt = len(self._pending & self._exempt)

    def summary(self) -> dict[str, Any]:
        added = np.asarray(self.stats.added_ms) if self.stats.added_ms else np.zeros(0)
        return {
            "sent": self.stats.sent, "returned": self.stats.returned, "missed": self.stats.missed,
            "late": self.stats.late,
            "added_ms_p50": round(float(np.percentile(added, 50)), 1) if added.size else None,
            "added_ms_p99": round(float(np.percentile(added, 99)), 1) if added.size else None,
            "added_ms_max": round(float(added.max()), 1) if added.size else None,
        }
