"""CORS for browser apps on other origins: the origins `--allow-origin` admits (and the server's own) get
preflights answered and Access-Control-Allow-Origin on every answer; any other origin gets neither. A
real server (echo), a real HTTP client sending what a browser sends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProc, start_server

KEY = "test-key-cors"
APP = "https://app.example"
OTHER = "https://evil.example"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = start_server("--model", "echo:0", "--allow-origin", APP, tmp_path=tmp_path_factory.mktemp("cors"),
                       env={"DUPLEX_API_KEY": KEY})
    yield srv
    srv.stop()


def preflight(srv: ServerProc, path: str, origin: str, method: str = "POST") -> httpx.Response:
    return httpx.options(f"{srv.url}{path}", headers={
        "Origin": origin, "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type, x-duplex-extensions"})


@pytest.mark.parametrize("path", ["/v1/realtime/calls", "/v1/realtime/calls/sess_x/hangup",
                                  "/v1/realtime/client_secrets", "/v1/realtime/calls/ice"])
def test_preflight_from_an_admitted_origin(server: ServerProc, path: str) -> None:
    r = preflight(server, path, APP, "GET" if path.endswith("/ice") else "POST")
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == APP
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "openai-beta", "x-duplex-extensions"} <= allowed
    assert int(r.headers["access-control-max-age"]) > 0
    assert "origin" in r.headers["vary"].lower()


def test_preflight_from_a_refused_origin(server: ServerProc) -> None:
    r = preflight(server, "/v1/realtime/calls", OTHER)
    assert r.status_code == 403
    assert "access-control-allow-origin" not in r.headers
    error = r.json()["error"]
    assert error["code"] == "origin_not_allowed" and "--allow-origin" in error["message"]


def test_answers_carry_the_origin(server: ServerProc) -> None:
    with httpx.Client(base_url=server.url) as http:
        auth = {"Authorization": f"Bearer {KEY}", "Origin": APP}
        minted = http.post("/v1/realtime/client_secrets", json={}, headers=auth)
        assert minted.status_code == 200 and minted.headers["access-control-allow-origin"] == APP
        assert "origin" in minted.headers["vary"].lower()
        # A refusal is readable too (the page learns why): no key, a bad offer, an unknown call.
        no_key = http.post("/v1/realtime/client_secrets", json={}, headers={"Origin": APP})
        assert no_key.status_code == 401 and no_key.headers["access-control-allow-origin"] == APP
        offer = http.post("/v1/realtime/calls", content=b"x", headers={**auth, "Content-Type": "text/html"})
        assert offer.status_code == 415 and offer.headers["access-control-allow-origin"] == APP
        hangup = http.post("/v1/realtime/calls/sess_none/hangup", headers=auth)
        assert hangup.status_code == 404 and hangup.headers["access-control-allow-origin"] == APP
        assert "location" in hangup.headers["access-control-expose-headers"].lower()
        # The server's own origin is admitted without being named.
        own = http.get("/healthz", headers={"Authorization": f"Bearer {KEY}", "Origin": server.url})
        assert own.headers["access-control-allow-origin"] == server.url


def test_other_origins_get_no_cors_headers(server: ServerProc) -> None:
    with httpx.Client(base_url=server.url) as http:
        auth = {"Authorization": f"Bearer {KEY}", "Origin": OTHER}
        health = http.get("/healthz", headers=auth)
        assert health.status_code == 200 and "access-control-allow-origin" not in health.headers
        offer = http.post("/v1/realtime/calls", content=b"v=0\r\n", headers={**auth, "Content-Type": "application/sdp"})
        assert offer.status_code == 403 and "access-control-allow-origin" not in offer.headers
        minted = http.post("/v1/realtime/client_secrets", json={}, headers=auth)
        assert minted.status_code == 403 and minted.json()["error"]["code"] == "origin_not_allowed"
        # No Origin at all (a backend, curl): served, with no CORS headers.
        plain = http.get("/healthz", headers={"Authorization": f"Bearer {KEY}"})
        assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_any_origin_with_a_star(tmp_path: Path) -> None:
    srv = start_server("--model", "echo:0", "--allow-origin", "*", tmp_path=tmp_path)
    try:
        r = preflight(srv, "/v1/realtime/client_secrets", OTHER)
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == OTHER
        # Without a server key anyone may mint; a key that is presented is still checked and spent.
        minted = httpx.post(f"{srv.url}/v1/realtime/client_secrets", json={}, headers={"Origin": OTHER})
        assert minted.status_code == 200 and minted.headers["access-control-allow-origin"] == OTHER
        auth = {"Authorization": f"Bearer {minted.json()['value']}"}
        assert httpx.get(f"{srv.url}/v1/realtime/calls/ice", headers=auth).status_code == 200
        first = httpx.post(f"{srv.url}/v1/realtime/calls", content=b"x", headers={**auth, "Content-Type": "x/y"})
        assert first.status_code == 415
        second = httpx.post(f"{srv.url}/v1/realtime/calls", content=b"x", headers={**auth, "Content-Type": "x/y"})
        assert second.status_code == 401 and second.json()["error"]["code"] == "client_secret_used"
    finally:
        srv.stop()
