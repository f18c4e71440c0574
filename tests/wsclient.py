"""A small real WebSocket client for tests: the `websockets` library plus protocol helpers."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

TICK = 4800


def pcm16(samples: np.ndarray) -> bytes:
    return np.asarray(samples, dtype="<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def random_pcm(n: int, seed: int = 0) -> np.ndarray:
    """Random PCM16 samples without zeros, so that silence and audio can never be confused."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-20000, 20000, n).astype(np.int16)
    x[x == 0] = 1
    return x


async def open_ws(url: str, extensions: bool = True, **kwargs: Any) -> ClientConnection:
    """A connection that asks for duplex's extensions (resume, ticks, duplex.* events) unless told not to."""
    if extensions:
        kwargs["additional_headers"] = {"X-Duplex-Extensions": "1", **dict(kwargs.get("additional_headers") or {})}
    return await connect(url, max_size=16 << 20, open_timeout=10, **kwargs)


async def send(ws: ClientConnection, event: dict[str, Any]) -> None:
    await ws.send(json.dumps(event))


async def recv_event(ws: ClientConnection, timeout: float = 10.0) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(msg, str), f"expected a JSON text frame, got {type(msg)}"
    event: dict[str, Any] = json.loads(msg)
    return event


Event = dict[str, Any]


async def recv_until(ws: ClientConnection, etype: str, timeout: float = 10.0) -> tuple[Event, list[Event]]:
    """Read events until one of type `etype`; returns it and everything read before it."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {etype!r} within {timeout}s; saw {[e['type'] for e in seen][-20:]}")
        ev = await recv_event(ws, left)
        if ev["type"] == etype:
            return ev, seen
        seen.append(ev)


async def start_session(url: str, pace: str = "media", **kwargs: Any) -> tuple[ClientConnection, dict[str, Any]]:
    """Connect, read session.created + duplex.session.resume, set the pace; returns (ws, resume event)."""
    ws = await open_ws(url, **kwargs)
    created = await recv_event(ws)
    assert created["type"] == "session.created", created
    resume = await recv_event(ws)
    assert resume["type"] == "duplex.session.resume", resume
    await send(ws, {"type": "session.update", "session": {"pace": pace}})
    updated, _ = await recv_until(ws, "session.updated")
    assert updated["session"]["pace"] == pace
    return ws, resume


async def collect_audio(ws: ClientConnection, n_ticks: int, timeout: float = 30.0) -> dict[int, bytes]:
    """Read `response.output_audio.delta` events until `n_ticks` distinct ticks arrived."""
    out: dict[int, bytes] = {}
    deadline = time.monotonic() + timeout
    while len(out) < n_ticks:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"only {len(out)} of {n_ticks} audio ticks arrived")
        ev = await recv_event(ws, left)
        if ev["type"] == "error":
            raise AssertionError(f"unexpected error event: {ev}")
        if ev["type"] == "response.output_audio.delta":
            out[ev["tick"]] = base64.b64decode(ev["delta"])
    return out


async def until_echoed(ws: ClientConnection, deltas: int = 2, timeout: float = 10.0) -> None:
    """Read events until `deltas` output audio deltas came back (the session is live both ways)."""
    deadline = time.monotonic() + timeout
    seen = 0
    while seen < deltas and time.monotonic() < deadline:
        msg = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        seen += msg.get("type") == "response.output_audio.delta"
    assert seen >= deltas, "the echo never came back"
