"""`duplex cluster`'s supervisor: with --restart-replicas a replica that exits is started again with the
same command (as a rolling restart needs); without it a dead replica stays dead (as a fail-over needs).
A `sleep` process stands in for the replica: what is checked is the supervisor's bookkeeping."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from deploy.cluster import Child, ClusterSpec, LocalCluster
from deploy.haproxy import Replica


@pytest.mark.parametrize("restart", [True, False])
def test_an_exited_replica_is_started_again_only_when_asked(tmp_path: Path, restart: bool) -> None:
    cluster = LocalCluster(ClusterSpec(workdir=tmp_path, restart_replicas=restart))
    child = Child("replica r1", ["sleep", "30"], 1, tmp_path / "r1.log")
    cluster.replicas = [(child, Replica("r1", "127.0.0.1", 1, 2, 1))]
    child.start()
    first = child.pid
    try:
        os.kill(first, signal.SIGTERM)
        child.proc.wait(5)  # type: ignore[union-attr]
        cluster.supervise_once()
        if restart:
            assert child.alive() and child.pid != first and cluster.replica_restarts == 1
        else:
            assert not child.alive() and child.exit_reported and cluster.replica_restarts == 0
        time.sleep(0.05)
        cluster.supervise_once()  # a second look changes nothing
        assert cluster.replica_restarts == (1 if restart else 0)
    finally:
        child.stop(timeout=5)


def test_the_key_the_replicas_read_from_a_file_is_the_one_the_health_checks_send(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("k-from-a-file\n")
    cluster = LocalCluster(ClusterSpec(workdir=tmp_path, serve_args=["--api-key-file", str(key_file)]))
    assert cluster.api_key == "k-from-a-file"  # was None: every health check 401, the cluster never ready
