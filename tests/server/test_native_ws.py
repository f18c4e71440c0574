"""The native interaction model behind the real server: `duplex serve --model native:tiny [--checkpoint]`."""

from __future__ import annotations

from pathlib import Path

import torch

from models.interaction import InteractionTransformer, init_weights, preset, save_checkpoint
from models.interaction.config import ACTIONS
from tests.wsclient import TICK, b64, collect_audio, pcm16, random_pcm, send, start_session

N_TICKS = 6
# Keep the server to one torch thread and a small KV pool: the test box has 2 shared cores.
ENV = {"DUPLEX_TORCH_THREADS": "1", "DUPLEX_KV_BUDGET_MB": "64"}


def speaking_checkpoint(path: Path) -> None:
    """tiny weights whose control head always chooses "speak", so the deltas carry the model's audio."""
    net = InteractionTransformer(preset("tiny"))
    init_weights(net, seed=5)
    bias = net.control_head.bias
    assert bias is not None
    with torch.no_grad():
        bias.zero_()
        bias[ACTIONS.index("speak")] = 5.0
    save_checkpoint(net, path, "tiny")


async def _talk(ws_url: str) -> dict[int, bytes]:
    ws, _ = await start_session(ws_url, pace="media")
    data = pcm16(random_pcm(N_TICKS * TICK, seed=3) // 8)
    for k in range(N_TICKS):
        await send(ws, {"type": "input_audio_buffer.append", "audio": b64(data[k * TICK * 2 : (k + 1) * TICK * 2])})
    out = await collect_audio(ws, N_TICKS, timeout=90)
    await ws.close()
    return out


async def test_native_tiny_checkpoint_gets_200ms_audio_deltas(duplex_server, tmp_path: Path) -> None:
    ckpt = tmp_path / "tiny.safetensors"
    speaking_checkpoint(ckpt)
    server = duplex_server(
        "--model", "native:tiny", "--checkpoint", str(ckpt), "--max-sessions", "2", "--background", "none", env=ENV
    )
    out = await _talk(server.ws_url)
    assert sorted(out) == list(range(N_TICKS)), "exactly one delta per micro-turn"
    assert all(len(d) == TICK * 2 for d in out.values()), "each delta is 200 ms of PCM16 at 24 kHz"
    assert all(any(d) for d in out.values()), "a speaking model's deltas carry its audio, not silence"
    assert "RANDOM weights" not in server.log()


async def test_native_tiny_random_init_warns_and_streams(duplex_server) -> None:
    server = duplex_server(
        "--model", "native:tiny", "--checkpoint", "random", "--max-sessions", "2", "--background", "none", env=ENV
    )
    out = await _talk(server.ws_url)
    assert sorted(out) == list(range(N_TICKS))
    assert all(len(d) == TICK * 2 for d in out.values())
    assert "RANDOM weights" in server.log(), "random initialisation must be announced"
