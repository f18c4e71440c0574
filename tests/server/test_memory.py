"""A finished connection's memory is freed soon after it ends, not after a hundred more.

Found by bench.reliability.soak: the echo server's RSS rose by steps, about 4.5 MB per 10 minutes with 8 sessions
coming, dropping and going. Nothing leaked (Python's allocations and object counts were flat); every
finished connection (uvicorn's protocol, websockets' zlib contexts, our connection and session) sits
in reference cycles, so only a full collection frees it, and with the server's start-up objects
CPython ran one only after hundreds of them. The heap kept the high-water mark of that pile. The
reaper now runs a full collection every --collect-every seconds (COLLECT_EVERY, 10, by default), cheap
because start-up objects are frozen (server/app.py). The test sets a 2 s interval: the check is the same
(every finished connection is freed within one interval after it ends), without waiting out 10 s.

The server's own memory report (DUPLEX_TRACEMALLOC, server/memdebug.py) says how much cyclic garbage
was waiting when it was asked, which is what this test reads; it tests that hook too.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.wsclient import until_echoed

SESSIONS = 12  # before the fix all of them waited; CPython ran its first full collection after hundreds
COLLECT_EVERY = 2.0  # the server's --collect-every in this test (seconds)


async def _session(ws_url: str, seconds: float = 1.0) -> None:
    """A real-time client: streams `seconds` of audio, reads its echoes, says goodbye (1000)."""
    async with connect(ws_url, max_size=1 << 24, additional_headers={"X-Duplex-Extensions": "1"}) as ws:
        for _ in range(2):  # session.created, duplex.session.resume
            await ws.recv()
        chunk = np.full(4800, 1000, "<i2").tobytes()
        t0 = time.monotonic()
        for i in range(int(seconds / 0.2)):
            await ws.send(chunk)
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.2 - time.monotonic()))
        await until_echoed(ws, timeout=5)


def _report(path: Path, pid: int, index: int) -> str:
    """Ask the server for memory report `index` (SIGUSR1) and return its text."""
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        reports = text.split("=== report ")
        if len(reports) > index + 1 and reports[index + 1].count("\n") >= 4:
            return reports[index + 1]
        time.sleep(0.2)
    raise AssertionError(f"the server wrote no memory report {index} to {path} within 20 s")


async def test_finished_connections_do_not_wait_for_a_rare_full_collection(duplex_server, tmp_path: Path) -> None:
    mem = tmp_path / "mem.txt"
    srv = duplex_server("--model", "echo:1", "--background", "none", "--collect-every", str(COLLECT_EVERY),
                        env={"DUPLEX_TRACEMALLOC": str(mem), "DUPLEX_TRACEMALLOC_FRAMES": "0"})
    pid = srv.proc.pid
    first = _report(mem, pid, 1)  # report 0 was written at start-up, before the model was loaded
    assert re.search(r"\(frozen [1-9]\d*\)", first), f"start-up objects are not frozen:\n{first}"
    for _ in range(SESSIONS // 4):
        await asyncio.gather(*(_session(srv.ws_url) for _ in range(4)))
    await asyncio.sleep(COLLECT_EVERY + 1)
    report = _report(mem, pid, 2)
    waiting = re.search(r"\bRealtimeConnection (\d+)", report)
    left = int(waiting.group(1)) if waiting else 0
    # Before the fix every one of them was still waiting (CPython had run no full collection).
    assert left == 0, f"{left} of {SESSIONS} finished connections still wait for the collector:\n{report}"
    assert re.search(r"automatic full collections since the last report: [1-9]", report), report
    assert srv.stop() == 0


def test_a_collection_interval_out_of_range_is_refused_with_its_bounds() -> None:
    from server.config import ServerConfig

    for bad in (0.0, 0.5, 3601.0):
        with pytest.raises(ValueError, match=r"--collect-every must be within 1\.\.3600"):
            ServerConfig(collect_every=bad).check()
    ServerConfig(collect_every=2.0).check()  # the test's own setting is accepted
