"""A real aiortc client peer for the WebRTC endpoint, used by bench/webrtc_latency.py and the tests.

It plays audio as its microphone through a paced track (recording when each 20 ms frame left), records
every frame it receives with its arrival time, and speaks the Realtime events on a data channel
(answering the server's `duplex.ping` like the web page does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from server._rtc_tracks import use_low_latency_buffer
from server.auth import RESUME_HEADER
from streaming.avframes import FrameToMono, mono_to_frame
from streaming.pacer import AudioPacer
from streaming.types import Audio

RATE = 48_000  # WebRTC audio clock
FRAME = 960  # 20 ms


class CallRefused(Exception):
    """The server answered the offer with an error status; `code` is the JSON error code."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        self.status = status
        self.code = str(err.get("code", ""))
        super().__init__(f"{status} {self.code}: {err.get('message', body)}")


class SignalTrack(MediaStreamTrack):
    """A microphone that plays what it is given (48 kHz mono float32), silence otherwise."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.pacer = AudioPacer(RATE, FRAME, max_queue_seconds=600.0)
        # One entry per frame handed to the encoder: (monotonic time, stream position after it), where the
        # stream is everything passed to play(); a frame carries positions [previous entry's, this one's).
        self.released: list[tuple[float, int]] = []
        self._held = asyncio.Event()  # set: stop producing frames at all (a peer that went quiet)

    def play(self, audio: Audio) -> int:
        """Queue audio; returns the stream position of its first sample (see `released`)."""
        start = self.pacer.stats.samples + self.pacer.queued
        self.pacer.push(audio)
        return start

    def mouth_time(self, position: int) -> float:
        """When the sample at `position` was "spoken": its frame left complete, 20 ms after it began."""
        ends = np.fromiter((end for _, end in self.released), dtype=np.int64, count=len(self.released))
        k = int(np.searchsorted(ends, position, side="right"))
        if k >= len(self.released):
            return float("nan")
        start = ends[k - 1] if k else 0
        return self.released[k][0] - FRAME / RATE + (position - start) / RATE

    def hold(self) -> None:
        """Send nothing any more, as a peer whose machine froze: no RTP at all."""
        self._held.set()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._held.is_set():
            await asyncio.Event().wait()  # until the sender is stopped (cancelled)
        samples, index = await self.pacer.next_frame()
        self.released.append((time.monotonic(), self.pacer.stats.samples))
        return mono_to_frame(samples, RATE, index * FRAME)


@dataclass
class Received:
    """Audio received from the server: one entry per decoded 20 ms frame."""

    pts: list[int] = field(default_factory=list)  # RTP-clock sample index of the frame's first sample
    arrival: list[float] = field(default_factory=list)  # monotonic time the frame came out of the decoder
    frames: list[Audio] = field(default_factory=list)  # mono float32 at 48 kHz

    def samples(self) -> int:
        return sum(len(f) for f in self.frames)

    def signal(self) -> tuple[Audio, Audio]:
        """(audio, ear_time): the received stream laid out by pts, and each sample's arrival time (s).

        Gaps in pts (lost packets) are filled with silence and get the arrival time of the next frame.
        """
        if not self.frames:
            return np.zeros(0, np.float32), np.zeros(0, np.float64)
        base = self.pts[0]
        end = max(p - base + len(f) for p, f in zip(self.pts, self.frames, strict=True))
        audio = np.zeros(end, np.float32)
        ear = np.full(end, np.nan)
        for p, t, f in zip(self.pts, self.arrival, self.frames, strict=True):
            i = p - base
            audio[i : i + len(f)] = f
            ear[i : i + len(f)] = t + np.arange(len(f)) / RATE  # played from its arrival, in order
        # Fill gaps with the next known time so that every sample has one.
        idx = np.where(~np.isnan(ear), np.arange(end), end - 1)
        idx = np.minimum.accumulate(idx[::-1])[::-1]
        return audio, ear[idx]


class RtcClient:
    def __init__(
        self, base_url: str, api_key: str | None = None, answer_pings: bool = True, low_latency: bool = True
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.answer_pings = answer_pings
        self.low_latency = low_latency  # the server's audio jitter buffer, not aiortc's 80 ms default
        self.pc = RTCPeerConnection()
        self.mic = SignalTrack()
        self.received = Received()
        self.events: list[dict[str, Any]] = []
        self.call_id: str | None = None
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._channel: RTCDataChannel | None = None
        self._open = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/sdp"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    async def connect(
        self, resume_token: str | None = None, video: MediaStreamTrack | None = None, timeout: float = 10.0
    ) -> None:
        """Offer, POST, answer, and wait until the data channel is open. Raises CallRefused."""
        pc = self.pc
        pc.addTrack(self.mic)
        if video is not None:
            pc.addTrack(video)
        channel = pc.createDataChannel("oai-events")
        self._channel = channel
        channel.on("open", self._open.set)
        channel.on("message", self._on_message)

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                self._tasks.append(asyncio.create_task(self._record(track)))

        await pc.setLocalDescription(await pc.createOffer())
        headers = {**self._headers(), "X-Duplex-Extensions": "1"}  # resume, duplex.* events
        if resume_token:  # in a header, not the URL: access logs must not record it
            headers[RESUME_HEADER] = resume_token
        async with httpx.AsyncClient(timeout=timeout) as http:
            r = await http.post(f"{self.base_url}/v1/realtime/calls", content=pc.localDescription.sdp, headers=headers)
        if r.status_code != 201:
            await pc.close()
            try:
                body = r.json()
            except ValueError:
                body = {"error": {"message": r.text}}
            raise CallRefused(r.status_code, body)
        self.call_id = r.headers["location"].rsplit("/", 1)[-1]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
        if self.low_latency:
            for transceiver in pc.getTransceivers():
                if transceiver.kind == "audio":
                    use_low_latency_buffer(transceiver.receiver)
        await asyncio.wait_for(self._open.wait(), timeout)

    def _on_message(self, msg: str | bytes) -> None:
        if not isinstance(msg, str):
            return
        ev = json.loads(msg)
        if ev.get("type") == "duplex.ping" and self.answer_pings and self._channel is not None:
            self._channel.send(json.dumps({"type": "duplex.pong", "t": ev.get("t")}))
            return
        ev["_received"] = time.monotonic()
        self.events.append(ev)
        self._queue.put_nowait(ev)

    async def _record(self, track: MediaStreamTrack) -> None:
        to_mono = FrameToMono(RATE)
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame)
            now = time.monotonic()
            samples = to_mono.convert(frame)
            self.received.pts.append(int(frame.pts or 0))
            self.received.arrival.append(now)
            self.received.frames.append(samples)

    async def send(self, event: dict[str, Any]) -> None:
        assert self._channel is not None, "connect() first"
        self._channel.send(json.dumps(event))

    async def wait_for(self, etype: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next event of type `etype` (events before it stay in `events`)."""
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {etype!r} event within {timeout}s; last seen: {seen[-15:]}")
            try:
                ev = await asyncio.wait_for(self._queue.get(), left)
            except TimeoutError:
                continue
            if ev["type"] == etype:
                return ev
            seen.append(ev["type"])

    async def hangup(self) -> int:
        """Ask the server to end the call now; returns the HTTP status."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(f"{self.base_url}/v1/realtime/calls/{self.call_id}/hangup", headers=headers)
        return r.status_code

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.pc.close()
