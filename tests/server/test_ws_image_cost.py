"""Pictures dear to decode, sent as a client sends them, on a real server: refused from their headers.

The review's picture (a 185 kB progressive JPEG of thousands of empty scans declaring 4096x4096) cost
seconds of server CPU to decode. Here it, a legal but dear progressive JPEG and a large PNG are sent on
both picture paths (an `input_image` part, a camera frame); each is answered with an error at once, the
server spends a fraction of a second of CPU on all of them, and the session goes on.
"""

from __future__ import annotations

import base64
import io
import os

from PIL import Image

from tests.server.test_ws_image import _error, data_url, image_item
from tests.streaming.test_image import empty_scans_jpeg, encode, photo
from tests.wsclient import TICK, b64, pcm16, random_pcm, recv_until, send, start_session


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_dear_pictures_refused_without_decoding(duplex_server) -> None:
    server = duplex_server("--model", "echo:0", "--max-sessions", "2")
    ws, _ = await start_session(server.ws_url, pace="media")
    hostile = empty_scans_jpeg()
    progressive = encode(Image.new("RGB", (4096, 4096), (90, 120, 200)), "JPEG", progressive=True, quality=60)
    png = encode(Image.new("RGBA", (2560, 1600), (1, 2, 3, 4)), "PNG")
    assert max(len(hostile), len(progressive), len(png)) < 190_000, "each fits the default message limit"

    before = cpu_seconds(server.proc.pid)
    for data, mime, code in [(hostile, "image/jpeg", "image_too_complex"),
                             (progressive, "image/jpeg", "image_too_complex"),
                             (png, "image/png", "image_too_large")]:
        await send(ws, image_item(data_url(data, mime)))
        await _error(ws, code)
        await send(ws, {"type": "duplex.input_video.append", "image": b64(data)})
        await _error(ws, code)
    spent = cpu_seconds(server.proc.pid) - before
    # Parsing six messages of ~250 kB of JSON and base64 costs a few tens of ms; decoding the first
    # picture alone took seconds.
    assert spent < 1.0, f"the server spent {spent:.2f} s of CPU on six refused pictures"

    # What a client really sends is still taken: a photo, a large baseline JPEG (decoded at 1/8 scale).
    for img, size in [(photo(1280, 720), (640, 360)), (Image.new("RGB", (4096, 2304), (9, 9, 9)), (640, 360))]:
        await send(ws, image_item(data_url(encode(img, "JPEG", quality=80))))
        added, _ = await recv_until(ws, "conversation.item.added")
        assert added["item"]["content"] == [{"type": "input_image", "width": size[0], "height": size[1]}]
    chunk = pcm16(random_pcm(TICK, seed=3))
    await ws.send(chunk)
    delta, _ = await recv_until(ws, "response.output_audio.delta")
    assert base64.b64decode(delta["delta"]) == chunk
    await ws.close()


def test_hostile_picture_is_what_the_review_sent() -> None:
    """The picture above declares 4096x4096 and is a progressive JPEG of thousands of scans."""
    data = empty_scans_jpeg()
    img = Image.open(io.BytesIO(data))
    assert img.size == (4096, 4096) and img.info.get("progressive")
    assert data.count(b"\xff\xda") > 3000
