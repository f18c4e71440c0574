"""The web client in a real headless Chromium (Debian's, driven by Playwright) against a real server.

Chromium's fake microphone plays a speech wav; the echo model sends it straight back, so remote audio
must arrive, and it echoes typed text as assistant text, so the transcript must update.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect as ws_connect

from streaming.wav import read_wav, write_wav
from tests.conftest import ARTIFACTS, ServerProc, start_server
from tests.server._background_stub import ScriptedOpenAI

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
MEDIA = ["microphone", "camera"]
playwright_sync = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium", allow_module_level=True)


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A spoken sentence (espeak-ng; a tone pattern if it is missing) as 48 kHz PCM16 for the fake mic."""
    out = tmp_path_factory.mktemp("audio") / "speech.wav"
    raw = out.with_name("raw.wav")
    if shutil.which("espeak-ng"):
        subprocess.run(["espeak-ng", "-w", str(raw), "Hello there. This is a test of the duplex web client."],
                       check=True, capture_output=True, timeout=30)
        audio, rate = read_wav(raw, 48_000)
    else:
        t = np.arange(48_000 * 3) / 48_000
        audio, rate = (0.3 * np.sin(2 * np.pi * 440 * t) * (np.sin(2 * np.pi * 2 * t) > 0)).astype(np.float32), 48_000
    write_wav(out, audio, rate)
    return out


@pytest.fixture(scope="module")
def browser(speech_wav: Path) -> Iterator[object]:
    pw = playwright_sync.sync_playwright().start()
    # No --use-fake-ui-for-media-stream: each test's context grants (or not) the microphone itself,
    # so that a refusal is the browser's real one.
    b = pw.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={speech_wav}", "--autoplay-policy=no-user-gesture-required",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ])
    try:
        yield b
    finally:
        b.close()
        pw.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """One echo server for the module, one session at a time (so 'full' is easy to reach), with a
    scripted OpenAI-compatible server as its background reasoner (the network edge of these tests)."""
    reasoner = ScriptedOpenAI().start()
    srv = start_server("--model", "echo", "--max-sessions", "1", "--resume-grace", "1",
                       "--background", "openai", "--background-url", reasoner.base_url,
                       "--background-model", "scripted", tmp_path=tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()
    reasoner.stop()


@pytest.fixture
def new_context(browser: object) -> Iterator[Callable[..., object]]:
    """Browser contexts closed after the test even when it fails, so a failed test's live call does not
    hold the server's only session and fail the tests after it."""
    made: list[object] = []

    def make(**kwargs: object) -> object:
        made.append(browser.new_context(**kwargs))  # type: ignore[attr-defined]
        return made[-1]

    yield make
    for context in made:
        context.close()  # type: ignore[attr-defined]


def _sessions(server: ServerProc) -> int:
    return int(httpx.get(f"{server.url}/healthz", timeout=5).json()["sessions"])


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def _message(page: object) -> tuple[str, str]:
    el = page.locator("#message")  # type: ignore[attr-defined]
    el.wait_for(state="visible", timeout=15_000)
    return str(el.get_attribute("data-code")), str(el.inner_text())


def test_call_audio_transcript_latency_and_layout(new_context: Callable[..., object], server: ServerProc) -> None:
    page = new_context(permissions=MEDIA, viewport={"width": 1280, "height": 800}).new_page()  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    assert page.url.endswith("/static/index.html")
    page.check("#camera")
    page.click("#connect")
    page.wait_for_selector("#status[data-state=live]", timeout=15_000)
    # The camera preview shows the local camera (Chromium's fake device), which is also sent to the server.
    page.wait_for_function("document.querySelector('#preview').videoWidth > 0", timeout=10_000)
    assert page.is_visible("#preview-box")
    # Remote audio: the echo of the fake microphone comes back with energy in it.
    page.wait_for_function("window.duplex.audioEnergy > 0 && window.duplex.packetsReceived > 50", timeout=15_000)
    # Typed text goes over the data channel; the echo model says it back as assistant text.
    page.fill("#text", "hello from the browser")
    page.press("#text", "Enter")
    page.wait_for_selector(".line.user .tag.typed", timeout=10_000)
    said = "[...document.querySelectorAll('.line.assistant .text')].map(e => e.textContent).join(' ')"
    page.wait_for_function(f"({said}).includes('hello from the browser')", timeout=10_000)
    # Ask: a background request, streamed into its own panel.
    page.fill("#text", "what time is it")
    page.click("#ask")
    page.wait_for_selector(".bg-item[data-status=completed]", timeout=15_000)
    assert "what time is it" in page.inner_text(".bg-item .query")
    assert page.inner_text(".bg-item .answer").startswith("answer:")
    # Latency readout: the page's own round trip and the server's tick lateness.
    page.wait_for_function("window.duplex.rttMs !== null && window.duplex.lateMs !== null", timeout=10_000)
    rtt = page.evaluate("window.duplex.rttMs")
    # A readout in milliseconds (not seconds, not zero); how small it is depends on the machine's load.
    assert 0 < rtt < 2000, f"data-channel round trip over loopback is not a plausible ms figure: {rtt}"
    assert page.inner_text("#rtt").endswith("ms") and page.inner_text("#late").endswith("ms")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-client.png"), full_page=True)
    # Phone width: nothing sticks out sideways.
    page.set_viewport_size({"width": 390, "height": 844})
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page is {overflow}px wider than a phone screen"
    page.screenshot(path=str(ARTIFACTS / "web-client-phone.png"), full_page=True)
    # Hanging up frees the session at once (not after the resume grace period).
    page.click("#connect")
    page.wait_for_selector("#status[data-state=idle]", timeout=5_000)
    _wait(lambda: _sessions(server) == 0, 5, "the session to be closed by the hang-up")
    assert not errors, f"page errors: {errors}"


def test_a_gpt_live_call_from_the_page(new_context: Callable[..., object], server: ServerProc) -> None:
    """Settings -> Protocol: GPT-Live. The page offers through POST /v1/live/sessions (JSON body, the
    session started with the call), hears the echo on the media track, and its hang-up ends the session."""
    page = new_context(permissions=MEDIA).new_page()  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.click("#settings summary")
    page.select_option("#protocol", "live")
    page.click("#connect")
    page.wait_for_selector("#status[data-state=live]", timeout=15_000)
    page.wait_for_selector(".line.note:has-text('GPT-Live session (model echo)')", timeout=10_000)
    page.wait_for_function("window.duplex.audioEnergy > 0 && window.duplex.packetsReceived > 50", timeout=15_000)
    assert page.is_disabled("#text") and page.is_disabled("#ask")  # GPT-Live takes no typed turns
    page.wait_for_function("window.duplex.rttMs !== null", timeout=10_000)  # duplex.ping answered on it too
    page.click("#connect")
    page.wait_for_selector("#status[data-state=idle]", timeout=5_000)
    _wait(lambda: _sessions(server) == 0, 5, "the live session to be closed by the hang-up")
    assert not errors, f"page errors: {errors}"


def test_refused_microphone_shows_its_message(new_context: Callable[..., object], server: ServerProc) -> None:
    page = new_context(permissions=[]).new_page()  # type: ignore[attr-defined]  # the prompt is denied
    page.goto(server.url + "/")
    page.click("#connect")
    code, text = _message(page)
    assert code == "mic_refused", text
    assert "refused" in text and "Allow" in text
    assert page.get_attribute("#status", "data-state") == "error"
    assert _sessions(server) == 0, "no session may be opened without a microphone"


def test_full_server_shows_its_message(new_context: Callable[..., object], server: ServerProc) -> None:
    _wait(lambda: _sessions(server) == 0, 5, "earlier sessions to be gone")
    with ws_connect(server.ws_url, open_timeout=10) as ws:  # takes the only session
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        page = new_context(permissions=MEDIA).new_page()  # type: ignore[attr-defined]
        page.goto(server.url + "/")
        page.click("#connect")
        code, text = _message(page)
        assert code == "server_full", text
        assert "full" in text and "Try again" in text


def test_api_key_is_asked_for_and_used(browser: object, tmp_path: Path) -> None:
    srv = start_server("--model", "echo", "--background", "none", tmp_path=tmp_path, env={"DUPLEX_API_KEY": "k-42"})
    context = browser.new_context(permissions=MEDIA)  # type: ignore[attr-defined]
    page = context.new_page()
    try:
        page.goto(srv.url + "/")  # the page itself is public
        page.click("#connect")
        code, text = _message(page)
        assert code == "invalid_api_key" and "API key" in text, text
        assert page.get_attribute("#settings", "open") is not None, "the settings open where the key goes"
        page.fill("#api-key", "k-42")
        page.click("#connect")
        page.wait_for_selector("#status[data-state=live]", timeout=15_000)
        assert page.is_hidden("#message")
        page.click("#connect")  # hang up (the key is sent with it too)
        page.wait_for_selector("#status[data-state=idle]", timeout=5_000)
    finally:
        context.close()
        srv.stop()


def test_unreachable_server_shows_its_message(browser: object, server: ServerProc) -> None:
    """Last in this module: it stops the module's server (saving another start-up)."""
    context = browser.new_context(permissions=MEDIA)  # type: ignore[attr-defined]
    page = context.new_page()
    try:
        page.goto(server.url + "/")
        server.stop()
        page.click("#connect")
        code, text = _message(page)
        assert code == "server_unreachable", text
        assert "Cannot reach the server" in text
    finally:
        context.close()
