"""The browser shows what the assistant sees: Chromium's fake camera plays a still of the astronaut
(tests/models/data/astronaut.jpg) over WebRTC to the default voice (`cascade:classic`: no Whisper to
load), and the page draws the face box and the caption from the server's `vision` events."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import ServerProc, start_server

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
if not shutil.which(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium", allow_module_level=True)
playwright_sync = pytest.importorskip("playwright.sync_api")
ASTRONAUT = Path(__file__).resolve().parent.parent / "models" / "data" / "astronaut.jpg"


def y4m(path: Path, rgb: Image.Image, frames: int = 10) -> Path:
    """A still picture as a 5 fps YUV 4:2:0 y4m clip, the format Chromium's fake camera plays (looped)."""
    ycc = rgb.convert("YCbCr")
    w, h = ycc.size
    y, cb, cr = (np.asarray(c) for c in ycc.split())
    half = [np.asarray(Image.fromarray(c).resize((w // 2, h // 2), Image.Resampling.BILINEAR)) for c in (cb, cr)]
    frame = b"FRAME\n" + y.tobytes() + half[0].tobytes() + half[1].tobytes()
    path.write_bytes(f"YUV4MPEG2 W{w} H{h} F5:1 Ip A1:1 C420jpeg\n".encode() + frame * frames)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    # One pocketsphinx process with one decoder: one browser session (the default builds 6 decoders).
    srv = start_server("--model", "cascade:classic,asr_processes=1,asr_decoders=1", "--background", "none",
                       tmp_path=tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


def test_overlay_shows_the_face_and_what_was_seen(server: ServerProc, tmp_path: Path) -> None:
    clip = y4m(tmp_path / "astronaut.y4m", Image.open(ASTRONAUT).convert("RGB"))
    pw = playwright_sync.sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-video-capture={clip}", "--autoplay-policy=no-user-gesture-required"])
    try:
        page = browser.new_context(permissions=["microphone", "camera"]).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.url + "/")
        page.check("#camera")
        page.click("#connect")
        page.wait_for_selector("#status[data-state=live]", timeout=15_000)
        page.wait_for_function("document.querySelector('#seen').textContent.includes('facing the camera')",
                               timeout=30_000)
        box = page.locator("#seen-box")
        assert box.is_visible()
        style = str(box.get_attribute("style"))
        left = float(style.split("left:")[1].split("%")[0])
        assert 20 < left < 60, style  # her face is in the middle of the picture
        assert not errors, errors
    finally:
        browser.close()
        pw.stop()
