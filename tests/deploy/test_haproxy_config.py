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
                 "server r1 127.0.0.1:9001 maxconn 5", 'agent-send "resume\\n"'):
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
