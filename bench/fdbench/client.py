"""Streaming client: one input clip through `/v1/realtime`, output placed on the input's timeline.

Media pace (`pace=media`): the server steps a micro-turn as soon as its 4,800 samples arrive and
answers every micro-turn with exactly one `response.output_audio.delta` carrying `tick`; the client
keeps a bounded window of micro-turns in flight so it never runs further ahead than the server's
input bound, and it knows it is done when the last tick has answered.

Real-time pace: the client sends one micro-turn every 200 ms on absolute deadlines; only non-silent
micro-turns come back, so it waits a short grace period after the last one. It records both
placements: by `tick` (what the model said in answer to which micro-turn) and by wall-clock arrival
(what a listener would have heard, with every network and scheduling delay included).

A real-time micro-turn stepped before its chunk arrived (an underrun, on a loaded machine) hears
nothing, and every later micro-turn answers a chunk one older than its index says. The tick placement
therefore puts each output where the input it had heard ends (`heard_samples` of `duplex.tick`), and
leaves out the output of a micro-turn that heard nothing new: the model spent it waiting, and the
input's timeline has no room for it.
"""

import asyncio
import base64
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.exceptions import WebSocketException

from bench.fdbench.lockstep import Lockstep, Slot
from bench.wsclient import open_session
from streaming.pcm import Audio, float32_to_pcm16, pcm16_to_float32
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, TICK_SECONDS

# Output micro-turn n is what the model says while input micro-turn n + 1 is being heard: its
# audio can only start once input n has fully arrived (docs/architecture.md: one micro-turn in, one out).
OUTPUT_TICK_OFFSET = 1
# Media pace: micro-turns sent but not yet answered, when the server does not say how many it takes
# (its `duplex.input.window`; streaming.chunker's default bound is 10 micro-turns).
MEDIA_WINDOW = 6
# Media pace: how long to wait after the switch for real-time ticks already in flight (see _settle).
MEDIA_SETTLE = 0.4
# Events kept in a sample's log (`output.events.json`): what the model heard, decided and said, and
# when. Value: the field holding the text worth keeping, or None.
LOGGED: dict[str, str | None] = {
    "input_audio_buffer.speech_started": None,
    "input_audio_buffer.speech_stopped": None,
    "conversation.item.input_audio_transcription.completed": "transcript",
    "response.created": None,
    "response.output_audio_transcript.done": "transcript",
    "response.output_audio_transcript.delta": "delta",  # a phrase started playing (bench.answer_lag)
    "response.done": None,
    "duplex.event": "event",
    "error": "error",
}


class ClientError(Exception):
    """The server refused the session, reported an error, or stopped answering."""


class ServerFull(ClientError):
    """The server is at capacity (it may still hold a previous sample's session for resumption)."""


@dataclass
class StreamResult:
    ticks: int  # micro-turns sent (the last one silence-padded)
    base: int | None = None  # the server tick that consumed our first micro-turn
    ignore_upto: int = -1  # ticks at or below this were stepped before our audio (silence)
    last_seen: int = -1  # newest server tick seen in any event
    by_tick: dict[int, list[Audio]] = field(default_factory=dict)  # server tick -> its audio deltas
    heard: dict[int, int] = field(default_factory=dict)  # server tick -> input samples heard through it
    arrivals: list[tuple[float, int, int]] = field(default_factory=list)  # (s since start, tick, part)
    errors: list[str] = field(default_factory=list)  # `error` events the server sent
    transcript: list[str] = field(default_factory=list)  # assistant transcript deltas
    events: list[tuple[int, str, str]] = field(default_factory=list)  # (server tick, type, text): see LOGGED
    _untimed: list[tuple[str, str]] = field(default_factory=list)  # logged events waiting for their tick

    def ours(self) -> dict[int, list[Audio]]:
        """Deltas of our micro-turns, keyed by input micro-turn index (0 = our first chunk)."""
        if self.base is None:
            return {}
        return {t - self.base: parts for t, parts in self.by_tick.items() if t >= self.base}

    def ready_at(self, tick: int) -> int:
        """Input samples heard through server tick `tick`: its output can be heard from there on.

        Without `heard_samples` (a server that does not send them) every micro-turn is taken to have
        heard exactly its own chunk.
        """
        base = self.base or 0
        if tick in self.heard:
            heard, total = self.heard[tick], self.ticks * TICK_SAMPLES
            if heard < total:
                return heard
            # Past the end of our input the server ticks on (silence) while the answer is still being
            # said, and every such micro-turn has heard the whole clip: each can be heard a micro-turn
            # after the one before, not all at the clip's end (which read as deltas 1-2 s "late").
            first = min(t for t, h in self.heard.items() if h >= total)
            return heard + (tick - first) * TICK_SAMPLES
        return (tick - base + OUTPUT_TICK_OFFSET) * TICK_SAMPLES

    def note(self, kind: str, text: str, tick: int | None) -> None:
        """Log an event. One without a tick belongs to the next tick seen: the server sends a
        micro-turn's events before that micro-turn's `duplex.tick`."""
        if tick is None:
            self._untimed.append((kind, text))
            return
        self.tick_seen(tick)
        self.events.append((tick, kind, text))

    def tick_seen(self, tick: int) -> None:
        """A message of micro-turn `tick` arrived: the events logged without a tick belong to it."""
        self.events.extend((tick, k, t) for k, t in self._untimed)
        self._untimed.clear()

    def event_log(self) -> list[dict[str, Any]]:
        """Logged events of our micro-turns, each at the input time its micro-turn's output is heard
        from (`ready_at`), for `output.events.json`."""
        if self.base is None:
            return []
        return [
            {"t": round(self.ready_at(tick) / SAMPLE_RATE, 3), "tick": tick - self.base, "type": kind, "text": text}
            for tick, kind, text in self.events
            if tick >= self.base and tick > self.ignore_upto
        ]

    def underruns(self) -> list[int]:
        """Our server ticks that heard no new input while input was still to come."""
        if self.base is None:
            return []
        total = self.ticks * TICK_SAMPLES
        return [
            t
            for t, h in sorted(self.heard.items())
            if t >= self.base and h == self.heard.get(t - 1, 0) and h < total
        ]

    def tick_placement(self, n_samples: int) -> Audio:
        """The output at 24 kHz by micro-turn, `n_samples` long (trimmed or zero-padded)."""
        out = np.zeros(n_samples + 2 * TICK_SAMPLES, dtype=np.float32)
        if self.base is None:
            return out[:n_samples]
        skipped = set(self.underruns())
        for tick in sorted(self.by_tick):
            if tick < self.base or tick in skipped:
                continue
            audio = np.concatenate(self.by_tick[tick])
            start = self.ready_at(tick)
            if start >= n_samples:
                continue
            out[start : start + len(audio)] = audio[: len(out) - start]
        return out[:n_samples]

    def arrival_placement(self, n_samples: int) -> Audio:
        """The output at 24 kHz as a player would have played it: each delta starts when it arrives,
        or when the previous one finishes, whichever is later."""
        out = np.zeros(n_samples, dtype=np.float32)
        cursor = 0
        for t, tick, part in sorted(self.arrivals):
            if self.base is None or tick < self.base:
                continue
            audio = self.by_tick[tick][part]
            start = max(round(t * SAMPLE_RATE), cursor)
            if start >= n_samples:
                break
            end = min(n_samples, start + len(audio))
            out[start:end] = audio[: end - start]
            cursor = start + len(audio)
        return out

    def lateness(self) -> list[float]:
        """Seconds each of our deltas arrived after the earliest moment it could play."""
        if self.base is None:
            return []
        return [t - self.ready_at(tick) / SAMPLE_RATE for t, tick, _ in self.arrivals if tick >= self.base]


def _connect(url: str, open_timeout: float) -> Any:
    return open_session(url, open_timeout=open_timeout)


async def _expect(ws: Any, wanted: str, timeout: float, seen: dict[str, dict[str, Any]] | None = None
                  ) -> dict[str, Any]:
    """The next `wanted` event; the events passed on the way are kept in `seen` by type (the newest)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClientError(f"no {wanted} from the server within {timeout:.0f}s; is it a duplex server?")
        raw = await asyncio.wait_for(ws.recv(), left)
        if isinstance(raw, bytes):
            continue
        msg = json.loads(raw)
        if seen is not None:
            seen[str(msg.get("type"))] = msg
        if msg.get("type") == wanted:
            return dict(msg)
        if msg.get("type") == "error":
            err = msg.get("error") or {}
            if isinstance(err, dict) and err.get("code") == "server_full":
                raise ServerFull(f"server full while waiting for {wanted}: {err.get('message')}")
            raise ClientError(f"server error while waiting for {wanted}: {msg.get('error', msg)}")


async def stream(
    url: str, audio: Audio, pace: str = "media", timeout: float = 120.0, grace: float = 1.5, full_wait: float = 90.0,
    lockstep: tuple[Lockstep, int] | None = None,
) -> StreamResult:
    """Stream 24 kHz mono `audio` through one session and collect what comes back.

    Real time waits `grace` after the clip before it closes the session; media pace streams as much
    silence after it (`media_grace_ticks`), so the session (and its background request) lives as long
    on its clock, and the next sample of a lockstep slot starts where it would in real time.
    `lockstep`: media pace only, (clock, slot) to step this session in lockstep with the other slots'
    (bench/fdbench/lockstep.py).

    A server at capacity is retried every half second for up to `full_wait` seconds: a server
    holds a finished sample's session for its resume grace period (`duplex serve --resume-grace`),
    and a one-session model (native:tiny on CPU) is full until that session is reaped.
    """
    return await retry_while_full(lambda: _stream_once(url, audio, pace, timeout, grace, lockstep), full_wait)


async def retry_while_full(once: Callable[[], Awaitable[StreamResult]], full_wait: float) -> StreamResult:
    """`once()`, tried again every half second for up to `full_wait` seconds while the server is full
    (either protocol: bench/fdbench/live_client.py streams through this too)."""
    deadline = time.monotonic() + full_wait
    while True:
        try:
            return await once()
        except ServerFull:
            if time.monotonic() > deadline:
                raise ServerFull(
                    f"server stayed full for {full_wait:.0f}s; start it with a shorter --resume-grace "
                    "(e.g. 0) or a larger --max-sessions for benchmark runs"
                ) from None
            await asyncio.sleep(0.5)


def media_grace_ticks(grace: float) -> int:
    """Silent micro-turns after a clip in media pace: as long as real time holds the session after it.

    Real time's last chunk leaves when the clip ends on its input timeline, and the session closes
    `grace` later; the next sample's input timeline starts a micro-turn before its first chunk leaves,
    a few ms after that (connecting). So the next sample starts `grace` - 0.2 s + a few ms after this
    clip's end: with the default 1.5 s, 6.5 micro-turns and a bit, taken as 7.
    """
    return max(0, math.ceil(grace / TICK_SECONDS - 1e-9) - 1)


def pad_clip(audio: Audio, pace: str, grace: float) -> tuple[int, Audio]:
    """The clip's micro-turns, and what to send: the clip in whole micro-turns (the last one
    silence-padded) and, in media pace, `media_grace_ticks` of silence after it."""
    if pace not in ("media", "realtime"):
        raise ValueError(f"pace must be 'media' or 'realtime', got {pace!r}")
    n_ticks = max(1, -(-len(audio) // TICK_SAMPLES))
    n_send = n_ticks + (media_grace_ticks(grace) if pace == "media" else 0)
    padded = np.zeros(n_send * TICK_SAMPLES, dtype=np.float32)
    padded[: len(audio)] = audio
    return n_ticks, padded


async def _stream_once(
    url: str, audio: Audio, pace: str, timeout: float, grace: float, lockstep: tuple[Lockstep, int] | None
) -> StreamResult:
    if lockstep is not None and pace != "media":
        raise ValueError("lockstep is for pace 'media' (real time has the wall clock in common)")
    n_ticks, padded = pad_clip(audio, pace, grace)
    n_send = len(padded) // TICK_SAMPLES
    result = StreamResult(ticks=n_ticks)
    seat = Slot(*lockstep) if lockstep is not None else None
    with client_errors(url, result, timeout):
        async with _connect(url, open_timeout=min(timeout, 20.0)) as ws:
            await _expect(ws, "session.created", 20.0)
            # tick_stats: a duplex.tick event after every stepped micro-turn, silent ones included,
            # which is how the client learns which server tick takes its first chunk.
            ext: dict[str, Any] = {"tick_stats": True}
            if seat is not None:
                ext["media_clock"] = seat.join
            await ws.send(json.dumps({"type": "session.update", "session": {"pace": pace, "duplex": ext}}))
            seen: dict[str, dict[str, Any]] = {}
            await _expect(ws, "session.updated", 20.0, seen)
            window = input_window_ticks(seen.get("duplex.input.window"))
            answered = asyncio.Event()
            t0 = time.monotonic()
            receiver = asyncio.create_task(_receive(ws, result, answered, n_send, lambda: t0, seat))
            try:
                if pace == "media":
                    await _settle(result, receiver)
                    t0 = time.monotonic()  # the moment input sample 0 leaves
                    await _send_media(ws, padded, result, receiver, timeout, seat, window)
                    await asyncio.wait_for(_wait_done(answered, receiver), timeout)
                else:
                    # A real-time session's clock starts at its first input and each tick follows its
                    # chunk's arrival, so micro-turn 0 takes our chunk 0 (underruns aside).
                    result.base = 0
                    # Chunk i is complete once input second 0.2 * (i + 1) has been heard: the
                    # timeline starts one micro-turn before chunk 0 leaves.
                    t0 = time.monotonic() - TICK_SECONDS
                    await _send_realtime(ws, padded, t0)
                    await asyncio.sleep(grace)
            finally:
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
    return result


@contextmanager
def client_errors(url: str, result: StreamResult, timeout: float) -> Iterator[None]:
    """A session's transport failures as `ClientError`s that say what to do (either protocol)."""
    try:
        yield
    except TimeoutError:
        got = len(result.ours())
        raise ClientError(
            f"server stopped answering: {got} of {result.ticks} micro-turns came back within {timeout:.0f}s"
        ) from None
    except OSError as e:
        raise ClientError(f"cannot connect to {url} ({e}); start it with `duplex serve`") from None
    except WebSocketException as e:
        raise ClientError(f"the WebSocket session failed ({type(e).__name__}: {e}); see the server log") from None


async def _settle(result: StreamResult, receiver: "asyncio.Task[None]") -> None:
    """Media pace: real-time ticks stepped before the switch (silence) may still be delivered; wait
    for them, then ignore every tick up to the newest one seen."""
    await asyncio.sleep(MEDIA_SETTLE)
    if receiver.done():
        receiver.result()
    result.ignore_upto = max(result.ignore_upto, result.last_seen)


async def _wait_done(answered: asyncio.Event, receiver: "asyncio.Task[None]") -> None:
    waiter = asyncio.create_task(answered.wait())
    done, _ = await asyncio.wait({waiter, receiver}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if receiver in done and not answered.is_set():
        receiver.result()  # re-raise why the receiver stopped
        raise ClientError("the server closed the session before answering every micro-turn")


def input_window_ticks(event: dict[str, Any] | None) -> int:
    """Micro-turns a media-pace client may have sent and not yet had answered: the server's
    `duplex.input.window` (docs/long-sessions.md), MEDIA_WINDOW from a server that does not send it."""
    ms = event.get("window_ms") if event else None
    return max(1, int(ms) // round(TICK_SECONDS * 1000)) if isinstance(ms, int) else MEDIA_WINDOW


async def _send_media(
    ws: Any, padded: Audio, result: StreamResult, receiver: "asyncio.Task[None]", timeout: float,
    seat: Slot | None = None, window: int = MEDIA_WINDOW, encode: "Callable[[Audio], str] | None" = None,
) -> None:
    """Media pace: every micro-turn as soon as the flow-control window allows. `encode` makes one
    micro-turn's message (default: the Realtime `input_audio_buffer.append`)."""
    encode = encode or _append
    n_ticks = len(padded) // TICK_SAMPLES
    deadline = time.monotonic() + timeout
    for i in range(n_ticks):
        if seat is not None:
            # The other sessions first: every one of them has had the micro-turn before this answered.
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            await asyncio.wait_for(seat.turn(i), left)
        # Flow control: keep at most `window` micro-turns unanswered.
        while i - len(result.ours()) >= window:
            if receiver.done():
                receiver.result()
                raise ClientError("the server closed the session mid-stream")
            if time.monotonic() > deadline:
                raise TimeoutError
            await asyncio.sleep(0.002)
        await ws.send(encode(padded[i * TICK_SAMPLES : (i + 1) * TICK_SAMPLES]))


async def _send_realtime(ws: Any, padded: Audio, t0: float, encode: "Callable[[Audio], str] | None" = None) -> None:
    encode = encode or _append
    for i in range(len(padded) // TICK_SAMPLES):
        # Absolute deadlines: chunk i leaves when it has been heard, at t0 + (i + 1) * 0.2 s, like
        # a microphone's; sending never drifts.
        delay = t0 + (i + 1) * TICK_SECONDS - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await ws.send(encode(padded[i * TICK_SAMPLES : (i + 1) * TICK_SAMPLES]))


def _append(chunk: Audio) -> str:
    payload = base64.b64encode(float32_to_pcm16(chunk)).decode()
    return json.dumps({"type": "input_audio_buffer.append", "audio": payload})


async def _receive(
    ws: Any, result: StreamResult, answered: asyncio.Event, n_ticks: int, start: Callable[[], float],
    seat: Slot | None = None,
) -> None:
    from websockets.exceptions import ConnectionClosed

    try:
        async for raw in ws:
            if isinstance(raw, bytes):
                continue  # binary frames are only sent to binary-audio clients
            msg = json.loads(raw)
            kind = msg.get("type")
            tick = msg.get("tick")
            if kind in ("duplex.tick", "response.output_audio.delta") and isinstance(tick, int):
                result.last_seen = max(result.last_seen, tick)
            if isinstance(kind, str) and kind in LOGGED:
                key = LOGGED[kind]
                response = msg.get("response")
                value = msg.get(key, "") if key else response.get("status", "") if isinstance(response, dict) else ""
                result.note(kind, str(value or "")[:300], tick if isinstance(tick, int) else None)
            elif isinstance(tick, int):
                result.tick_seen(tick)
            if kind == "duplex.tick" and isinstance(tick, int) and isinstance(msg.get("heard_samples"), int):
                result.heard[tick] = msg["heard_samples"]
            if kind == "response.output_audio.delta":
                if not isinstance(tick, int):
                    result.errors.append(f"audio delta without an integer tick: {str(msg)[:120]}")
                    continue
                if tick <= result.ignore_upto:
                    continue
                if result.base is None:
                    result.base = tick  # media pace: the first tick after the switch is our chunk 0
                parts = result.by_tick.setdefault(tick, [])
                result.arrivals.append((time.monotonic() - start(), tick, len(parts)))
                parts.append(pcm16_to_float32(base64.b64decode(msg.get("delta", ""))))
                done = len(result.ours())
                if seat is not None and len(parts) == 1:  # a micro-turn's first delta: it is answered
                    await seat.answered(done)
                if done >= n_ticks:
                    answered.set()
            elif kind == "response.output_audio_transcript.delta":
                result.transcript.append(str(msg.get("delta", "")))
            elif kind == "error":
                result.errors.append(str(msg.get("error", msg))[:300])
    except ConnectionClosed:
        return
