"""Streaming client for GPT-Live: one input clip through `/v1/live/sessions`, into the same `StreamResult`.

What differs from the Realtime client (bench/fdbench/client.py) is only the wire:

- the session opens with `session.start` (pace in the `session.duplex` extension) and is ready at
  `session.started`; hand-offs go to the server's reasoner (Responses delegation) when it has one,
  as they do on `/v1/realtime` (`start_like_realtime`); input goes out as `session.input_audio.append`
  (base64 PCM16 at 24 kHz);
- the output is one continuous track, one `session.output_audio.delta` per micro-turn, silence
  included, from the session's first input audio (its micro-turn 0), and the deltas carry no tick:
  the n-th delta is micro-turn n. So our chunk 0 is micro-turn 0 in both paces, and a media-pace
  clip is done when every micro-turn sent has its delta;
- transcripts and hand-offs carry their place on the timeline (`start_ms`/`end_ms`, `offset_ms`),
  which is where the log puts them.

The event log (`output.events.json`) keeps the Realtime log's vocabulary where a GPT-Live event
means the same thing, so `bench.answer_lag` and the report read runs of either protocol: an output
transcript delta is logged as `response.output_audio_transcript.delta` (a phrase started playing),
a `session.delegation.created` as the `duplex.event` `delegate`. Input transcript deltas and
errors keep their own names.

Not available on this protocol (so not measured through it): `heard_samples` (a real-time micro-turn
stepped before its chunk arrived cannot be told apart, so every micro-turn is placed as having heard
its own chunk), and `session.duplex.media_clock` (media pace with several sessions at once in lockstep).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed

from bench.fdbench.client import (
    MEDIA_WINDOW,
    ClientError,
    ServerFull,
    StreamResult,
    _send_media,
    _send_realtime,
    _wait_done,
    client_errors,
    pad_clip,
    retry_while_full,
)
from bench.wsclient import open_session
from streaming.pcm import Audio, float32_to_pcm16, pcm16_to_float32
from streaming.types import TICK_SAMPLES, TICK_SECONDS

PATH = "/v1/live/sessions"
MODEL = "gpt-live-1"  # any name is accepted; the server's own model serves the session (docs/live.md)
TICK_MS = round(TICK_SECONDS * 1000)


def append_message(chunk: Audio) -> str:
    """One micro-turn of input as GPT-Live's `session.input_audio.append` (base64 PCM16 at 24 kHz)."""
    return json.dumps({"type": "session.input_audio.append",
                       "audio": base64.b64encode(float32_to_pcm16(chunk)).decode("ascii")})


def start_message(pace: str, **session: Any) -> str:
    """`session.start` for a duplex server: `pace` through the `session.duplex` extension."""
    return json.dumps({"type": "session.start", "session": {"model": MODEL, "duplex": {"pace": pace}, **session}})


# Hand-offs answered by the server's own reasoner, as on /v1/realtime (the model name is echoed only).
RESPONSES = {"type": "responses", "responses": {"model": "duplex-background"}}


class Unavailable(ClientError):
    """The server refused the configuration: it cannot serve what was asked (`code`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"the server refused session.start ({code}): {message}")
        self.code = code


async def start_like_realtime(ws: Any, pace: str) -> dict[str, Any]:
    """Start a session whose hand-offs the server's reasoner answers, as /v1/realtime's are (Responses
    delegation), or, on a server without one, under client delegation, where nobody answers them (as
    nobody does on /v1/realtime without a reasoner): so an FD-bench run measures the same conversation
    through either protocol. The refused start opens nothing; the second goes on the same socket."""
    await ws.send(start_message(pace, delegation=RESPONSES))
    try:
        return await wait_started(ws)
    except Unavailable as e:
        if e.code != "responses_unavailable":
            raise
    await ws.send(start_message(pace))
    return await wait_started(ws)


async def wait_started(ws: Any, timeout: float = 20.0) -> dict[str, Any]:
    """Read up to `session.started`; a refusal (an `error` first) raises `ServerFull` or `ClientError`."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClientError(f"no session.started within {timeout:.0f}s; is {PATH} served (a duplex server)?")
        raw = await asyncio.wait_for(ws.recv(), left)
        if isinstance(raw, bytes):
            continue
        msg: dict[str, Any] = json.loads(raw)
        if msg.get("type") == "session.started":
            return msg
        if msg.get("type") == "error":
            err = msg.get("error") or {}
            if isinstance(err, dict) and err.get("code") == "server_full":
                raise ServerFull(f"server full: {err.get('message')}")
            if isinstance(err, dict):
                raise Unavailable(str(err.get("code")), str(err.get("message")))
            raise ClientError(f"the server refused session.start: {err}")


async def stream(
    url: str, audio: Audio, pace: str = "media", timeout: float = 120.0, grace: float = 1.5, full_wait: float = 90.0,
) -> StreamResult:
    """Stream 24 kHz mono `audio` through one GPT-Live session; as `client.stream`, without lockstep."""
    return await retry_while_full(lambda: _stream_once(url, audio, pace, timeout, grace), full_wait)


async def _stream_once(url: str, audio: Audio, pace: str, timeout: float, grace: float) -> StreamResult:
    n_ticks, padded = pad_clip(audio, pace, grace)
    n_send = len(padded) // TICK_SAMPLES
    result = StreamResult(ticks=n_ticks, base=0)  # the session's micro-turn 0 is our first chunk
    with client_errors(url, result, timeout):
        async with open_session(url, open_timeout=min(timeout, 20.0)) as ws:
            await start_like_realtime(ws, pace)
            answered = asyncio.Event()
            t0 = time.monotonic()
            receiver = asyncio.create_task(_receive(ws, result, answered, n_send, lambda: t0))
            try:
                if pace == "media":
                    t0 = time.monotonic()
                    # No `duplex.input.window` on this protocol: the default window is within the
                    # server's input bound.
                    await _send_media(ws, padded, result, receiver, timeout, None, MEDIA_WINDOW, append_message)
                    await asyncio.wait_for(_wait_done(answered, receiver), timeout)
                else:
                    t0 = time.monotonic() - TICK_SECONDS  # as client.py: the timeline starts a micro-turn earlier
                    await _send_realtime(ws, padded, t0, append_message)
                    await asyncio.sleep(grace)
            finally:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
            # A polite end: the server frees the session now instead of holding it for a resume.
            # The socket may already be gone: the server reaps the session then.
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps({"type": "session.close"}))
    return result


def _stamp_tick(msg: dict[str, Any]) -> int | None:
    """The micro-turn an event belongs to, from its place on the timeline."""
    end = msg.get("end_ms")
    if isinstance(end, int):
        return end // TICK_MS - 1  # a fragment said in micro-turn n ends at 200 (n + 1)
    offset = msg.get("offset_ms")
    return offset // TICK_MS if isinstance(offset, int) else None


async def _receive(ws: Any, result: StreamResult, answered: asyncio.Event, n_send: int,
                   start: Callable[[], float]) -> None:
    tick = -1  # the newest micro-turn whose audio has arrived; later events are that micro-turn's
    try:
        async for raw in ws:
            if isinstance(raw, bytes):
                continue
            msg = json.loads(raw)
            kind = msg.get("type")
            if kind == "session.output_audio.delta":
                tick += 1
                result.last_seen = tick
                result.tick_seen(tick)
                result.arrivals.append((time.monotonic() - start(), tick, 0))
                result.by_tick[tick] = [pcm16_to_float32(base64.b64decode(msg.get("delta", "")))]
                if tick + 1 >= n_send:
                    answered.set()
                continue
            at = _stamp_tick(msg)
            at = at if at is not None else (tick if tick >= 0 else None)
            if kind == "session.output_transcript.delta":
                text = str(msg.get("delta", ""))
                result.transcript.append(text)
                result.note("response.output_audio_transcript.delta", text[:300], at)
            elif kind == "session.input_transcript.delta":
                result.note(kind, str(msg.get("delta", ""))[:300], at)
            elif kind == "session.delegation.created":
                result.note("duplex.event", "delegate", at)
            elif kind == "error":
                result.errors.append(str(msg.get("error", msg))[:300])
                result.note(kind, str(msg.get("error", ""))[:300], at)
            elif kind == "session.closed":
                return
    except ConnectionClosed:
        return


def silent(delta: bytes, threshold: int = 59) -> bool:
    """A PCM16 delta with no sample above `threshold` (about -55 dBFS, where LiveKit's GPT-Live client
    starts a reply): the track's silence is digital silence, so any speech is far above it."""
    return not len(delta) or int(np.abs(np.frombuffer(delta, "<i2").astype(np.int32)).max()) <= threshold
