"""The generated HAProxy configuration, checked by HAProxy itself, and the agent's answers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from deploy.haproxy import ProxyOptions, Replica, render
from server.agent import agent_line
from server.sessions import Load


def test_haproxy_accepts_the_generated_config(tmp_path: Path) -> None:
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed (make setup-test installs it)")
    replicas = [Replica("r1", "127.0.0.1", 9001, 9101, 4, 1), Replica("gpu-a", "10.0.0.2", 8000, 8001, 300)]
    text = render(replicas, ProxyOptions(port=9000, api_key="k"))
    for line in ("balance leastconn", "option redispatch 1", "retry-on all-retryable-errors",
                 "use-server gpu-a if token_gpu_a", "acl token_gpu_a req.hdr(x-duplex-resume-token) -m beg gpu-a.",
                 "server r1 127.0.0.1:9001 maxconn 4", "agent-port 8001", "use_backend duplex_resume if resume",
                 "server r1 127.0.0.1:9001 maxconn 5", 'agent-send "resume\\n"',
                 "acl call_token_r1 path_beg /v1/realtime/calls/sess_r1_",
                 "acl call_token_r1 path_beg /v1/live/sessions/sess_r1_"):
        assert line in text, line
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text)
    check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_replica_ids_must_be_distinct_and_routable() -> None:
    with pytest.raises(ValueError):
        render([Replica("r1", "h", 1, 2, 1), Replica("r1", "h", 3, 4, 1)])
    with pytest.raises(ValueError):
        Replica("r.1", "h", 1, 2, 1)


def test_agent_answers_from_the_health_figures() -> None:
    def load(sessions: int, draining: bool = False, problem: str | None = None) -> Load:
        return Load(sessions=sessions, capacity=2, attached=sessions, draining=draining, problem=problem)

    assert agent_line(load(1)) == "up ready maxconn:2\n"
    assert agent_line(load(2)) == "up drain maxconn:2\n"  # full: no new session, resumes still routed
    assert agent_line(load(0, draining=True)) == "drain\n"
    assert agent_line(load(0, problem="engine loop died")) == "down\n"
    # Draining with a session store: resumes must go elsewhere, so not even use-server may pick it.
    moving = Load(sessions=1, capacity=2, attached=1, draining=True, problem=None, moving=True)
    assert agent_line(moving) == "down\n"
    # The resume backend asks for the room for a restored session: the capacity plus the reserve.
    full = Load(sessions=2, capacity=2, attached=2, draining=False, problem=None, reserve=1)
    assert agent_line(full) == "up drain maxconn:2\n"
    assert agent_line(full, resume=True) == "up ready maxconn:3\n"
    over = Load(sessions=3, capacity=2, attached=3, draining=False, problem=None, reserve=1)
    assert agent_line(over, resume=True) == "up drain maxconn:3\n"


def test_the_proxy_replaces_a_forged_forwarding_header_with_the_clients_address(tmp_path: Path) -> None:
    """A client's own X-Forwarded-For passed through the proxy: a replica trusting the proxy's header
    (--forwarded-allow-ips) would take it for another client; the proxy sets it to the source address."""
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed (make setup-test installs it)")
    import contextlib
    import http.server
    import socket
    import threading
    import time

    import httpx

    seen: list[tuple[str | None, str | None]] = []

    class Replica_(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/probe":
                seen.append((self.headers.get("X-Forwarded-For"), self.headers.get("Forwarded")))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Replica_)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    front = port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(render([Replica("r1", "127.0.0.1", backend.server_address[1], port(), 4)],
                          ProxyOptions(port=front, check_interval_ms=100)))
    proxy = subprocess.Popen(["haproxy", "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{front}/probe", timeout=2,
                          headers={"X-Forwarded-For": "198.51.100.7", "Forwarded": "for=198.51.100.7"})
            time.sleep(0.1)
        assert seen, "the proxy never forwarded the request"
        assert seen[0] == ("127.0.0.1", None), seen
    finally:
        proxy.terminate()
        proxy.wait(10)
        backend.shutdown()
