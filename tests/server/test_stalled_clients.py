"""Clients that stop reading, through the real server (found by bench.reliability.chaos).

- A client cut for not reading is told why: the close frame (1008 and its reason) is the next thing it
  reads, not something queued behind megabytes of events it will never get to (before: the server's
  close waited on a writer stuck behind the full socket, gave up after 1 s, and the client that read
  again found a reset connection and no reason).
- A client that never reads and never closes does not pin a server socket forever: the kernel drops
  the connection once our data has gone unacknowledged for --stalled-connection-s (before: the socket,
  its send buffer and the transport's buffer stayed until the client went away, long after the session
  was reaped).
"""

from __future__ import annotations

import os
import time

from bench.reliability._never_reader import NeverReader
from server.limits import DEFAULT_OUTBOX_BYTES
from tests.conftest import ServerProc

OUTBOX = 65536
BIG = {"type": "session.update", "session": {"instructions": "i" * 30_000}}  # its echo is ~30 kB


def _flood(srv: ServerProc, outbox: int) -> NeverReader:
    """Connect without ever reading and send until the server must have cut us."""
    client = NeverReader(srv.ws_url, "127.0.0.1", srv.port)
    for _ in range(2 * outbox // 30_000 + 200):  # answers far past the socket buffers and the outbox
        if not client.send(BIG):
            break
    return client


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_cut_client_that_reads_again_gets_the_reason(duplex_server) -> None:
    # The default outbox (8 MB): the reason must not wait behind what was queued.
    srv = duplex_server("--model", "echo", "--background", "none")
    client = _flood(srv, DEFAULT_OUTBOX_BYTES)
    try:
        time.sleep(3.0)  # well after the cut: a client that was busy, then reads again
        _, code, read = client.drain(idle=5.0)
        assert code == 1008, f"no close frame reached the client (read {read} events, close {code})"
        assert "not reading" in client.close_reason and "resume" in client.close_reason, client.close_reason
    finally:
        client.close()
    assert srv.stop() == 0
    assert "Traceback" not in srv.log(), srv.log()[-3000:]


def test_a_client_that_never_reads_nor_closes_is_dropped(duplex_server) -> None:
    srv = duplex_server("--model", "echo", "--background", "none", "--max-outbox-bytes", str(OUTBOX),
                        "--resume-grace", "1", "--stalled-connection-s", "2")
    pid = srv.proc.pid
    time.sleep(0.5)
    before = _fds(pid)
    client = _flood(srv, OUTBOX)
    try:
        assert _fds(pid) > before, "the client's connection should hold a server socket while it is open"
        deadline = time.monotonic() + 20
        while _fds(pid) > before:  # the client still holds its end open and never reads
            assert time.monotonic() < deadline, (
                f"the server still holds the socket of a client that has read nothing for 20 s "
                f"({_fds(pid)} descriptors, {before} before it connected)")
            time.sleep(0.5)
    finally:
        client.close()
    assert srv.stop() == 0
