"""Secrets as a hostile or careless party would find them: a resume token in a percent-encoded query
parameter name (in the access log), the OpenAPI pages (Swagger UI from a CDN, in the web client's
origin), an API key on the command line (`ps` shows argv to every user); on a real server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

from tests.conftest import ROOT

KEY = "k-file-0123456789"


async def test_a_key_from_a_file_hidden_tokens_redacted_and_no_api_pages(duplex_server, tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    srv = duplex_server("--model", "echo", "--background", "none", "--api-key-file", str(key_file),
                        env={"DUPLEX_API_KEY": KEY})  # the environment only for the fixture's health polls
    auth = {"Authorization": f"Bearer {KEY}"}
    assert KEY.encode() not in Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes()
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(srv.url + "/metrics")).status_code == 401  # the file's key is the key
        assert (await http.get(srv.url + "/metrics", headers=auth)).status_code == 200
        for path in ("/docs", "/redoc", "/openapi.json"):  # were 200, Swagger UI from cdn.jsdelivr.net
            assert (await http.get(srv.url + path, headers=auth)).status_code == 404, path
        # Starlette decodes the parameter's name: this is `resume_token`, and the logs once kept it.
        r = await http.post(srv.url + "/v1/realtime/calls?resume%5Ftoken=r1.SECRET-ONE.mac",
                            content="not sdp", headers={**auth, "Content-Type": "application/sdp"})
        assert r.status_code == 400
    async with connect(srv.ws_url + "?resume%5ftoken=r1.SECRET-TWO.mac", additional_headers=auth) as ws:
        await ws.recv()  # the refusal: the token is unknown
    log = srv.log()
    assert "SECRET-ONE" not in log and "SECRET-TWO" not in log, log
    assert "resume%5Ftoken=<redacted>" in log


def test_a_key_that_cannot_travel_as_a_bearer_token_is_refused_without_being_echoed(tmp_path: Path) -> None:
    bad = tmp_path / "bad-key"
    bad.write_text('a key with "quotes"\n')
    cases = (["--api-key-file", str(bad)], ["--api-key", "spaced xyzzy"],
             ["--api-key", "k", "--api-key-file", str(bad)])
    for args in cases:
        done = subprocess.run([sys.executable, "-m", "server.cli", "serve", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "quotes" not in done.stderr and "xyzzy" not in done.stderr, done.stderr
