"""What a finished connection holds is freed when it ends, not at the next full garbage collection
(found by bench.reliability.soak: the cascade server's threads grew in pairs with every session that came and went).

Each resampler is an FFmpeg filter graph with threads of its own; a connection sits in reference
cycles, so before the fix its resamplers (and a closed session's model state) lived until the cyclic
collector ran, and the server's thread count climbed by four for every session that used another rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

import numpy as np
from websockets.asyncio.client import connect

from tests.wsclient import until_echoed

SETTLE_S = 8.0  # s the closed sessions get to let go of their threads (a dropped one: grace and reaping)


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _names(pid: int) -> list[str]:
    """The server's threads by name (a failure says which kind grew)."""
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            names.append(open(f"/proc/{pid}/task/{tid}/comm").read().strip())  # noqa: SIM115
    return sorted(names)


async def _session_at_16k(ws_url: str) -> None:
    ws = await connect(ws_url, additional_headers={"X-Duplex-Extensions": "1"})
    for _ in range(2):  # session.created, duplex.session.resume
        await ws.recv()
    fmt = {"type": "audio/pcm", "rate": 16000}
    await ws.send(json.dumps({"type": "session.update",
                              "session": {"pace": "media", "audio": {"input": {"format": fmt},
                                                                     "output": {"format": fmt}}}}))
    for _ in range(3):  # both resamplers run (and start their threads)
        await ws.send(np.full(3200, 100, "<i2").tobytes())
    await until_echoed(ws, timeout=10)
    await ws.close(1000)


async def test_sessions_at_other_rates_leave_no_threads_behind(duplex_server) -> None:
    # A session the server saw dropped (not closed) is kept for its resume grace with what it holds: a
    # short grace, so that a close frame lost on a loaded machine cannot pass for a leak.
    srv = duplex_server("--model", "echo:1", "--background", "none", "--resume-grace", "1")
    pid = srv.proc.pid
    # Warm-up: threads the server starts once, lazily, and keeps: the default executor's grow with the work
    # that overlaps (on a loaded machine, up to its bound), so the warm-up overlaps as much as the test will.
    await asyncio.gather(*(_session_at_16k(srv.ws_url) for _ in range(6)))
    deadline, last = time.monotonic() + SETTLE_S, -1
    while _threads(pid) != last and time.monotonic() < deadline:  # until the warm-up's sessions have let go
        last = _threads(pid)
        await asyncio.sleep(1.0)
    start, before = _threads(pid), _names(pid)
    for _ in range(6):
        await _session_at_16k(srv.ws_url)
    # A session ends a moment after its socket (the close runs on the server's loop): on a loaded machine
    # the last ones may still be closing. Poll briefly; a leak (freed only by a full collection) stays.
    deadline = time.monotonic() + SETTLE_S
    while _threads(pid) > start and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert _threads(pid) <= start, (f"{_threads(pid)} threads after 6 more sessions, {start} before them: "
                                    f"{_names(pid)} against {before}")
    assert srv.stop() == 0
