"""`--model moshi --checkpoint DIR` behind the real server (the app, runtime and engine under uvicorn
on a free port, in a thread of this process: no second torch and moshi start-up) and a real WebSocket
client.

A tiny random Moshi streams audio back in 200 ms deltas; the connection drops and the session resumes
with its token, and every delta, before and after, is what the same model gives that session (the
same id, so the same sampling seed) stepped alone: the slot and its streaming state were kept
through the grace.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

# Not importorskip: models.moshi imports moshi itself, with torch.compile off on a CPU.
if importlib.util.find_spec("moshi") is None:
    pytest.skip("the optional moshi package is not installed: make setup-moshi", allow_module_level=True)

from models.base import TickInput
from models.moshi import load_moshi, tiny
from models.registry import load_model
from streaming.pcm import float32_to_pcm16, pcm16_to_float32
from tests.server._inproc import serve_in_thread
from tests.wsclient import TICK, collect_audio, open_ws, pcm16, random_pcm, recv_event, start_session

SENT = [pcm16(random_pcm(TICK, seed=s) // 4) for s in range(5)]


async def _talk(ws_url: str) -> tuple[dict[int, bytes], str]:
    """3 micro-turns, a dropped connection, a resume, 2 more: (deltas by tick, session id)."""
    ws, resume = await start_session(ws_url, pace="media")
    await ws.send(b"".join(SENT[:3]))
    out = await collect_audio(ws, 3, timeout=60)
    ws.transport.abort()  # the network drops: no close frame; the session waits, unstepped, in its slot
    await asyncio.sleep(0.3)
    ws2 = await open_ws(ws_url + "?resume_token=" + resume["resume_token"])
    assert (await recv_event(ws2))["type"] == "session.created"
    again = await recv_event(ws2)
    assert again["type"] == "duplex.session.resume" and again["resumed"] is True and again["tick"] == 3
    await ws2.send(b"".join(SENT[3:]))
    out.update(await collect_audio(ws2, 2, timeout=60))
    await ws2.close()
    return out, str(resume["session_id"])


async def test_moshi_streams_audio_and_resumes_in_its_slot(tmp_path: Path) -> None:
    ckpt = tiny.write(tmp_path / "tiny-moshi")
    # One torch thread: the test box has 2 shared cores. Known phase groups and capacity: no calibration.
    served = load_model("moshi:slots=2,threads=1", checkpoint=str(ckpt))
    with serve_in_thread(served, max_sessions=2, phase_groups=1, resume_grace=20) as server:
        out, session_id = await _talk(server.ws_url)
    assert sorted(out) == list(range(5)) and all(len(d) == TICK * 2 for d in out.values())
    assert any(np.frombuffer(out[k], "<i2").any() for k in out), "the model's audio, not silence"

    # The same session alone, in the same 2 slots (other slot counts may round the last bit of a sample
    # differently): its deltas, bit for bit after PCM16.
    torch.set_num_threads(1)
    model = load_moshi("slots=2,threads=1", checkpoint=str(ckpt))
    state = model.open(session_id)
    for k, data in enumerate(SENT):
        want = model.step([(state, TickInput(pcm16_to_float32(data), TICK))])[0].audio
        assert out[k] == float32_to_pcm16(want), f"micro-turn {k}: the server's delta differs from the model alone"
