"""The fuzz witness: one real-time echo session streaming in its own process for the whole run.

Its own process, so that the fuzzer's CPU use (Hypothesis generating cases) cannot delay the
witness's sends or reads and be mistaken for the server's lateness.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

from bench.reliability._common import LoopLag
from bench.reliability._echo_client import EchoClient


def _main(ws_url: str, delay: int, late_after: float, stop: MpEvent, ready: MpEvent, out: mp.Queue) -> None:
    async def run() -> dict[str, Any]:
        client = EchoClient(ws_url, seed=424242, delay=delay, late_after=late_after)
        if not await client.connect():
            return {"error": f"witness could not connect: {client.stats.errors}"}
        ready.set()
        lag = LoopLag()  # the witness's own loop: a late echo it explains is not the server's
        lag_probe = asyncio.create_task(lag.run(until=float("inf")))
        streamer = asyncio.create_task(client.stream())
        while not stop.is_set() and not streamer.done():
            await asyncio.sleep(0.1)
        client.stop.set()
        await streamer
        await client.settle(2.0)
        lag_probe.cancel()
        dropped = not client.connected
        await client.leave()
        late = client.stats.late_at
        stalled = lag.explained(late, late_after * 1000)
        return {**client.summary(), "dropped": dropped, "errors": client.stats.errors[:5],
                "late_at": late[:50], "late_while_witness_stalled": stalled,
                "witness_loop_lag_max_ms": round(lag.max_ms, 1)}

    out.put(asyncio.run(run()))


class Witness:
    def __init__(self, ws_url: str, delay: int = 1, late_after: float = 0.2) -> None:
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._ready = ctx.Event()
        self._out: mp.Queue = ctx.Queue()
        self._proc = ctx.Process(target=_main, args=(ws_url, delay, late_after, self._stop, self._ready, self._out),
                                 name="fuzz-witness", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self._proc.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the witness session did not start (is the server an echo model?)")

    def finish(self, timeout: float = 30.0) -> dict[str, Any]:
        self._stop.set()
        try:
            result: dict[str, Any] = self._out.get(timeout=timeout)
        except queue.Empty:
            result = {"error": "the witness did not report"}
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
        return result
