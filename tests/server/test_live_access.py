"""The live WebSocket's door and extras against a real `duplex serve --model echo:0` on a free port, with
real WebSocket clients: an ephemeral key opens one live session, a live session moves the live series of
/metrics (and not the realtime ones), and the camera extension takes a small JPEG only from a client that
asked for extensions."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidStatus

from tests.conftest import ServerProc, start_server
from tests.wsclient import open_ws, recv_event, send

KEY = "live-access-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--background", "none", "--max-sessions", "2",
                       tmp_path=tmp_path_factory.mktemp("live-access"), env={"DUPLEX_API_KEY": KEY})
    yield srv
    srv.stop()


def url(server: ServerProc) -> str:
    return f"ws://{server.host}:{server.port}/v1/live/sessions"


async def start(server: ServerProc, key: str = KEY, extensions: bool = True) -> ClientConnection:
    ws = await open_ws(url(server), extensions=extensions, additional_headers={"Authorization": f"Bearer {key}"})
    await send(ws, {"type": "session.start", "session": {"model": "gpt-live-1"}})
    ev = await recv_event(ws)
    assert ev["type"] == "session.started", ev
    return ws


async def next_not_audio(ws: ClientConnection, timeout: float = 5.0) -> dict[str, Any]:
    while True:
        ev = await recv_event(ws, timeout)
        if ev["type"] not in ("session.output_audio.delta", "duplex.session.resume"):
            return ev


async def close(ws: ClientConnection) -> None:
    await send(ws, {"type": "session.close"})
    while (await next_not_audio(ws))["type"] != "session.closed":
        pass
    await ws.close()


def mint(server: ServerProc) -> str:
    r = httpx.post(f"{server.url}/v1/realtime/client_secrets", json={}, headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    return str(r.json()["value"])


async def test_an_ephemeral_key_opens_one_live_session(echo: ServerProc) -> None:
    key = mint(echo)
    ws = await start(echo, key)
    await close(ws)
    with pytest.raises(InvalidStatus) as refused:
        await open_ws(url(echo), additional_headers={"Authorization": f"Bearer {key}"})
    assert refused.value.response.status_code == 401
    assert b"client_secret_used" in refused.value.response.body
    with pytest.raises(InvalidStatus) as unknown:  # a key this server never minted
        await open_ws(url(echo), additional_headers={"Authorization": "Bearer ek_never-minted"})
    assert unknown.value.response.status_code == 401


def scrape(server: ServerProc) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{server.url}/metrics", headers=AUTH, timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_live_session_moves_the_live_series(echo: ServerProc) -> None:
    before = scrape(echo)
    ws = await start(echo)
    try:
        await send(ws, {"type": "no.such.event"})
        assert (await next_not_audio(ws))["error"]["code"] == "unknown_event"
        during = await asyncio.to_thread(scrape, echo)
    finally:
        await close(ws)
    assert value(during, "duplex_protocol_sessions", protocol="live", transport="websocket") == 1
    assert value(during, "duplex_protocol_sessions", protocol="realtime", transport="websocket") == 0
    assert value(during, "duplex_sessions_live") >= 1  # the total, as before, counts both protocols
    name = "duplex_protocol_client_errors_total"
    assert value(during, name, protocol="live", code="unknown_event") == value(
        before, name, protocol="live", code="unknown_event") + 1
    assert value(during, name, protocol="realtime", code="unknown_event") == value(
        before, name, protocol="realtime", code="unknown_event")
    # The unlabelled total moved too: existing dashboards see the live errors as before.
    assert value(during, "duplex_client_errors_total", code="unknown_event") == value(
        before, "duplex_client_errors_total", code="unknown_event") + 1
    await asyncio.sleep(0.3)
    after = await asyncio.to_thread(scrape, echo)
    assert value(after, "duplex_protocol_sessions", protocol="live", transport="websocket") == 0


def jpeg(w: int = 64, h: int = 48) -> str:
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h)], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=80)
    return base64.b64encode(buf.getvalue()).decode("ascii")


async def alive(ws: ClientConnection, eid: str) -> None:
    """Nothing else came back (no error): the mute that follows is the next answer."""
    await send(ws, {"type": "session.input_audio.mute", "event_id": eid})
    ev = await next_not_audio(ws)
    assert ev["type"] == "session.input_audio.muted" and ev["client_event_id"] == eid, ev


async def test_the_camera_extension_takes_a_jpeg_from_extension_clients_only(echo: ServerProc) -> None:
    ws = await start(echo, extensions=True)
    try:
        await send(ws, {"type": "duplex.input_video.append", "image": jpeg(), "event_id": "v1"})
        await alive(ws, "a1")
        await send(ws, {"type": "duplex.input_video.append", "image": base64.b64encode(b"not a picture").decode(),
                        "event_id": "v2"})
        err = (await next_not_audio(ws))["error"]
        assert err["code"] == "invalid_image" and err["param"] == "image" and err["client_event_id"] == "v2"
        await send(ws, {"type": "duplex.input_video.append", "image": "%%%", "event_id": "v3"})
        assert (await next_not_audio(ws))["error"]["code"] == "invalid_base64"
        await send(ws, {"type": "duplex.input_video.append", "image": jpeg(), "extra": 1})
        assert (await next_not_audio(ws))["error"]["code"] == "unknown_parameter"
        for _ in range(8):  # well past the burst of 3 frames at once
            await send(ws, {"type": "duplex.input_video.append", "image": jpeg()})
        await send(ws, {"type": "session.input_audio.unmute", "event_id": "u1"})
        codes = []
        while (ev := await next_not_audio(ws))["type"] == "error":
            codes.append(ev["error"]["code"])
        assert ev["type"] == "session.input_audio.unmuted" and ev["client_event_id"] == "u1", ev
        assert len(codes) >= 3 and set(codes) == {"video_rate_exceeded"}, codes
    finally:
        await close(ws)
    plain = await start(echo, extensions=False)
    try:
        await send(plain, {"type": "duplex.input_video.append", "image": jpeg(), "event_id": "v4"})
        err = (await next_not_audio(plain))["error"]
        assert err["code"] == "unknown_event" and err["client_event_id"] == "v4"
        assert "X-Duplex-Extensions" in err["message"]
    finally:
        await close(plain)
