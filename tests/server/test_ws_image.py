"""Pictures on the WebSocket: Realtime `input_image` parts and the `duplex.input_video.append` camera.

Every bad picture gets an error event naming what is wrong, and the session goes on. One server and
one session carry all the cases (each server start costs about a second).
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
from PIL import Image
from websockets.asyncio.client import ClientConnection

from tests.wsclient import TICK, b64, pcm16, random_pcm, recv_until, send, start_session


def jpeg(w: int = 64, h: int = 48) -> bytes:
    y, x = np.mgrid[0:h, 0:w]  # a smooth picture: a few kB, like a camera's
    rgb = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def huge_png() -> bytes:
    """A few hundred bytes declaring 5000x5000 pixels: refused from its header, before any decode."""
    buf = io.BytesIO()
    Image.new("1", (5000, 5000)).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64,{b64(data)}"


def image_item(url: str, text: str | None = None) -> dict:
    content: list[dict] = [{"type": "input_image", "image_url": url}]
    if text is not None:
        content.append({"type": "input_text", "text": text})
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": content}}


async def _user_item(ws: ClientConnection) -> dict:
    """The next user item added: the model's own response items (its answer to typed text) come between."""
    while True:
        added, _ = await recv_until(ws, "conversation.item.added")
        if added["item"].get("role") == "user":
            return added


async def _error(ws: ClientConnection, code: str) -> dict:
    err, _ = await recv_until(ws, "error")
    assert err["error"]["code"] == code, err
    assert err["error"]["message"]
    return err


async def test_pictures_accepted_and_bad_ones_refused(duplex_server) -> None:
    server = duplex_server("--model", "echo:0", "--max-sessions", "2")
    ws, _ = await start_session(server.ws_url, pace="media")

    # A picture and a question in one item, as OpenAI Realtime sends them.
    await send(ws, image_item(data_url(jpeg(800, 600)), "what is this?"))
    added = await _user_item(ws)
    parts = added["item"]["content"]
    assert parts[0] == {"type": "input_image", "width": 640, "height": 480}, "shrunk to perception's size"
    assert parts[1] == {"type": "input_text", "text": "what is this?"}
    # A picture alone is a message too.
    await send(ws, image_item(data_url(jpeg(), "image/jpeg")))
    added = await _user_item(ws)
    assert added["item"]["content"] == [{"type": "input_image", "width": 64, "height": 48}]

    good = jpeg()
    cases = [
        (image_item(data_url(b"hello, not a picture")), "invalid_image"),
        (image_item(data_url(good[: len(good) // 2])), "invalid_image"),  # truncated JPEG
        (image_item(data_url(good[:200] + bytes(len(good) - 200))), "invalid_image"),  # corrupt body
        (image_item(data_url(good, "image/gif")), "unsupported_image_type"),
        (image_item("https://example.com/cat.jpg"), "invalid_image_url"),
        (image_item("data:image/png;base64,%%%"), "invalid_base64"),
        (image_item(data_url(huge_png(), "image/png")), "image_too_large"),
        ({"type": "conversation.item.create", "item": {"type": "message", "content": [
            {"type": "input_image", "image_url": data_url(good)}] * 2}}, "too_many_images"),
        ({"type": "duplex.input_video.append", "image": "not base64!"}, "invalid_base64"),
        ({"type": "duplex.input_video.append", "image": b64(b"GIF89a....")}, "invalid_image"),
    ]
    for event, code in cases:
        await send(ws, event)
        await _error(ws, code)

    # NaN / Infinity are not JSON: refused, not echoed back in session.updated.
    await ws.send('{"type": "session.update", "session": {"tools": [{"type": "function", "name": "f", '
                  '"parameters": {"type": "object", "maximum": NaN}}]}}')
    err = await _error(ws, "invalid_json")
    assert "NaN" in err["error"]["message"]
    await ws.send('{"type": "response.create", "x": -Infinity}')
    await _error(ws, "invalid_json")

    # Pictures in items: a burst beyond the bound is refused.
    for _ in range(6):
        await send(ws, image_item(data_url(good)))
    err = await _error(ws, "video_rate_exceeded")
    assert "pictures are arriving faster than 5 a second" in err["error"]["message"]

    # The camera: a burst within the bound is taken, frames faster than it are refused one by one.
    frame = b64(good)
    for _ in range(8):
        await send(ws, {"type": "duplex.input_video.append", "image": frame})
    err = await _error(ws, "video_rate_exceeded")
    assert "5 a second" in err["error"]["message"]

    # ... and the session still answers (after the other refusals of the burst).
    chunk = pcm16(random_pcm(TICK, seed=11))
    await ws.send(chunk)
    delta, seen = await recv_until(ws, "response.output_audio.delta")
    assert base64.b64decode(delta["delta"]) == chunk
    assert {e["error"]["code"] for e in seen if e["type"] == "error"} <= {"video_rate_exceeded"}
    await ws.close()


def test_strict_json_on_both_transports() -> None:
    """The data channel's keep-alive reader and the codec share one strict parser."""
    from server import protocol as p

    for text in ('{"a": NaN}', '{"a": Infinity}', '[-Infinity]'):
        try:
            p.loads_strict(text)
        except ValueError:
            pass
        else:
            raise AssertionError(f"{text} was accepted")
    assert p.loads_strict(json.dumps({"a": 1.5})) == {"a": 1.5}
