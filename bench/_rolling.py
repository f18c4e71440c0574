"""`bench.cluster --rolling`: real-time clients in conversation through the proxy while each replica
in turn gets SIGTERM and is started again (bench/cluster.py starts the cluster and prints the figures)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection

from bench.wsclient import open_session, recv_event, recv_until, set_session, start

TICK = 4800  # samples of one micro-turn at 24 kHz


class Talker:
    """One client in conversation: real-time audio up, its echo down; moves when told to."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n
        self.instructions = f"talker {n}"
        self.session_id = ""
        self.token = ""
        self.moves = 0
        self.gaps: list[float] = []  # s without audio across each move
        self.lost = ""  # why the conversation was lost; "" while kept
        self.last_audio = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        ws, self.token = await _session_rt(self.url, self.instructions)
        self.session_id = await _current_id(ws)
        while not stop.is_set():
            moved = await self._talk(ws, stop)
            if not moved:
                break
            again = await self._move()
            if again is None:
                return
            ws = again
        with contextlib.suppress(Exception):
            await ws.close()

    async def _talk(self, ws: ClientConnection, stop: asyncio.Event) -> bool:
        """Until `stop` (False) or a drain notice (True): send a micro-turn every 200 ms, read its echo."""
        sender = asyncio.create_task(_send_paced(ws, self.n))
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    ev = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                    if ev["type"] == "response.output_audio.delta":
                        self.last_audio = time.monotonic()
                    elif ev["type"] == "duplex.session.draining":
                        self.token = ev["resume_token"]
                        ws.transport.abort()  # act on it: reconnect through the proxy with the token
                        return True
                    elif ev["type"] == "duplex.session.resume":
                        self.token = ev["resume_token"]
            return False
        finally:
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender

    async def _move(self) -> ClientConnection | None:
        before = self.last_audio
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                ws = await open_session(self.url, resume_token=self.token)
                first = await recv_event(ws)
                if first["type"] == "session.created":
                    got = first["session"]
                    if got["id"] != self.session_id or got["instructions"] != self.instructions:
                        self.lost = "came back as another session"
                        return None
                    resumed = await recv_event(ws)
                    self.token = resumed["resume_token"]
                    sender = asyncio.create_task(_send_paced(ws, self.n))
                    try:
                        while json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] != "response.output_audio.delta":
                            pass
                    finally:
                        sender.cancel()
                    self.last_audio = time.monotonic()
                    self.gaps.append(self.last_audio - before)
                    self.moves += 1
                    return ws
                await ws.close()
            await asyncio.sleep(0.05)
        self.lost = "not resumed within 15 s"
        return None


async def _session_rt(url: str, instructions: str) -> tuple[ClientConnection, str]:
    ws, resume = await start(url, instructions=instructions)
    return ws, str(resume["resume_token"])


async def _current_id(ws: ClientConnection) -> str:
    await set_session(ws)
    updated, _ = await recv_until(ws, "session.updated")
    return str(updated["session"]["id"])


async def _send_paced(ws: ClientConnection, seed: int) -> None:
    """200 ms of audio every 200 ms, on absolute deadlines (a real-time client)."""
    pcm = np.random.default_rng(seed).integers(-8000, 8000, TICK, dtype=np.int16).tobytes()
    start = time.monotonic()
    n = 0
    while True:
        await ws.send(pcm)
        n += 1
        await asyncio.sleep(max(0.0, start + n * 0.2 - time.monotonic()))


async def rolling(state_path: Path, sessions: int, settle: float) -> dict[str, Any]:
    state = json.loads(state_path.read_text())
    url = str(state["url"])
    stop = asyncio.Event()
    talkers = [Talker(url, i) for i in range(sessions)]
    tasks = [asyncio.create_task(t.run(stop)) for t in talkers]
    await asyncio.sleep(2.0)
    for rid in [r["id"] for r in state["replicas"]]:
        rep = next(r for r in json.loads(state_path.read_text())["replicas"] if r["id"] == rid)
        print(f"SIGTERM to replica {rid} (pid {rep['pid']}) ...", flush=True)
        os.kill(rep["pid"], signal.SIGTERM)
        deadline = time.monotonic() + 60
        while True:  # until it exited, was started again and answers its health check
            now = next(r for r in json.loads(state_path.read_text())["replicas"] if r["id"] == rid)
            if now["pid"] != rep["pid"] and await _healthy(now["port"]):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"replica {rid} did not come back within 60 s; logs in {state['workdir']}")
            await asyncio.sleep(0.2)
        print(f"  {rid} is back (pid {now['pid']})", flush=True)
        await asyncio.sleep(settle)  # the proxy has its agent's figures again
    await asyncio.sleep(2.0)
    flowing = [t for t in talkers if time.monotonic() - t.last_audio < 1.0]
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    kept = [t for t in talkers if not t.lost and t in flowing]
    gaps = np.array([g for t in talkers for g in t.gaps]) if any(t.gaps for t in talkers) else np.array([np.nan])
    result = {"sessions": sessions, "kept": len(kept), "lost": sessions - len(kept),
              "moves": sum(t.moves for t in talkers), "gap_p50_s": float(np.percentile(gaps, 50)),
              "gap_p99_s": float(np.percentile(gaps, 99)), "gap_max_s": float(np.max(gaps)),
              "why_lost": [t.lost or "audio stopped" for t in talkers if t not in kept]}
    print(f"rolling restart of {len(state['replicas'])} replicas under {sessions} conversations: "
          f"{result['kept']} kept, {result['lost']} lost (floor 0); {result['moves']} moves; gap heard p50 "
          f"{result['gap_p50_s']:.2f} s, p99 {result['gap_p99_s']:.2f} s, max {result['gap_max_s']:.2f} s")
    return result


async def _healthy(port: int) -> bool:
    with contextlib.suppress(Exception):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
        line = await asyncio.wait_for(reader.readline(), 2)
        writer.close()
        return b" 200 " in line
    return False
