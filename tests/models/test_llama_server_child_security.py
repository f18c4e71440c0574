"""The llama-server child as another local user would find it: its port answered anyone (every
conversation's prompt in /slots, the model to use for free); now it needs the key the supervisor gave
it in its environment, and /slots is off. A real child, the bundled model."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from models.background import Done, TextDelta
from models.background.llama_server import LlamaServerConfig, LlamaServerReasoner, binary_available

# The child is niced: beside a full parallel suite it missed the 60 s start on CI. Run alone (~4 s).
pytestmark = pytest.mark.serial


def _status(url: str, body: bytes | None = None, key: str | None = None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, body, headers), timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_child_answers_only_with_its_key_and_shows_no_slots() -> None:
    if not binary_available():
        pytest.skip("llama-server is not built (make setup builds it)")
    r = LlamaServerReasoner(LlamaServerConfig(parallel=1, max_tokens=8))
    try:
        r.preload().result(timeout=60)
        url, key = r.child.url, r.child.api_key
        assert key.encode() not in Path(f"/proc/{r.child.pid}/cmdline").read_bytes()
        prompt = json.dumps({"prompt": "Hello", "n_predict": 1}).encode()
        assert _status(url + "/completion", prompt) == 401  # was 200: anyone on the host
        assert _status(url + "/slots") in (401, 404, 501)
        assert _status(url + "/slots", key=key) in (404, 501)  # was 200, every slot's prompt
        assert _status(url + "/completion", prompt, key=key) == 200

        async def ask() -> str:
            text = ""
            async for d in r.stream([{"role": "user", "content": "Say hi."}], []):
                if isinstance(d, TextDelta):
                    text += d.text
                elif isinstance(d, Done):
                    return text
            raise AssertionError("no Done")

        asyncio.run(ask())  # the reasoner's own client has the key
        assert r.cost is not None  # so had the calibration at start-up
    finally:
        asyncio.run(r.aclose())
