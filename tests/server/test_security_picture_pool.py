"""The picture pool: its own threads, one picture per session, a bounded queue, refusals at once.

A real pool with real threads; the pictures are stood in for by jobs that wait on an event, so what is
running and what waits is known exactly when the next picture arrives.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading

import pytest
from PIL import Image

from server.picture_pool import PicturePool, PoolFull
from server.pictures import picture
from server.protocol import ProtocolError


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _blocked(gate: threading.Event, ran: list[str], nice: list[int] | None = None) -> str:
    ran.append(threading.current_thread().name)
    if nice is not None:
        nice.append(_niceness())
    assert gate.wait(10.0), "the test never opened the gate"
    return "done"


async def test_full_pool_refuses_at_once_and_counts_until_the_thread_is_done() -> None:
    pool = PicturePool(workers=1, queued=1)
    gate, ran = threading.Event(), []
    first = asyncio.create_task(pool.run("a", _blocked, gate, ran))
    second = asyncio.create_task(pool.run("b", _blocked, gate, ran))
    await asyncio.sleep(0.05)
    assert pool.taken == 2 and len(ran) == 1, "one running, one waiting"
    with pytest.raises(PoolFull) as busy:
        await pool.run("c", _blocked, gate, ran)
    assert busy.value.code == "server_busy"
    with pytest.raises(PoolFull) as twice:
        await pool.run("b", _blocked, gate, ran)
    assert twice.value.code == "picture_in_flight"
    # A client that goes away: its waiting picture is dropped; its running one keeps its place until done.
    second.cancel()
    first.cancel()
    await asyncio.sleep(0.05)
    assert pool.taken == 1, "the running picture still counts"
    gate.set()
    while pool.taken:
        await asyncio.sleep(0.01)
    assert len(ran) == 1, "the cancelled waiting picture never ran"
    assert ran[0].startswith("picture"), f"decoded on {ran[0]}, not on the pool's own threads"
    assert await pool.run("c", _blocked, gate, ran) == "done"


@pytest.mark.skipif(sys.platform != "linux", reason="threads have their own nice value on Linux only")
async def test_decode_threads_yield_the_cpu_to_the_ticks() -> None:
    """Under load, the event loop and the model's threads run before a picture is decoded."""
    pool = PicturePool(workers=1, queued=0)
    gate, ran, nice = threading.Event(), [], []
    gate.set()
    await pool.run("a", _blocked, gate, ran, nice)
    assert nice[0] >= min(19, _niceness() + 10), f"decode thread nice {nice[0]}, this thread {_niceness()}"
    assert _niceness() == os.getpriority(os.PRIO_PROCESS, 0), "the process's own threads are unchanged"


async def test_picture_refusals_are_protocol_errors() -> None:
    pool = PicturePool(workers=1, queued=0)
    gate, ran = threading.Event(), []
    hog = asyncio.create_task(pool.run("other session", _blocked, gate, ran))
    await asyncio.sleep(0.05)
    buf = io.BytesIO()
    Image.new("RGB", (64, 48)).save(buf, "JPEG")
    with pytest.raises(ProtocolError) as err:
        await picture(buf.getvalue(), "image", "ev1", pool=pool)
    assert (err.value.code, err.value.param, err.value.event_id) == ("server_busy", "image", "ev1")
    gate.set()
    await hog
    frame = await picture(buf.getvalue(), "image", "ev2", pool=pool)
    assert frame.shape == (48, 64, 3)
