"""A WebSocket client that really never reads: a raw socket driven by websockets' sans-I/O protocol.

A client library keeps reading into its own buffers (and Linux autotunes a loopback receive buffer up
to tens of MB), so "a client that stops reading" built on one may never push back on the server. This
one sets a small fixed receive buffer, does the handshake, and after that only writes, until asked to
read what the server left for it (`drain`).
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

RCVBUF = 32 * 1024  # bytes; fixed, so the kernel does not absorb the server's output for us


class NeverReader:
    def __init__(self, ws_url: str, host: str, port: int) -> None:
        self.proto = ClientProtocol(parse_uri(ws_url), max_size=None)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self.sock.settimeout(10)
        self.sock.connect((host, port))
        self.proto.send_request(self.proto.connect())
        self._flush()
        while self.proto.handshake_exc is None and not self.proto.events_received() and \
                self.proto.state.name == "CONNECTING":
            self.proto.receive_data(self.sock.recv(4096))
        if self.proto.handshake_exc is not None:
            raise RuntimeError(f"handshake failed: {self.proto.handshake_exc}")
        self.close_reason = ""  # the reason in the server's close frame, once `drain` read it
        self.blocked = False  # a send could not complete: the server stopped reading us (fine) or is stuck

    def _flush(self, timeout: float = 10.0) -> None:
        self.sock.settimeout(timeout)
        for data in self.proto.data_to_send():
            if data:
                self.sock.sendall(data)

    def send(self, event: dict[str, Any], timeout: float = 2.0) -> bool:
        """Send one event; False when the server has not taken it within `timeout` (it pushes back)."""
        self.proto.send_text(json.dumps(event).encode())
        try:
            self._flush(timeout)
        except (TimeoutError, OSError):
            self.blocked = True
            return False
        return True

    def drain(self, idle: float = 10.0) -> tuple[list[dict[str, Any]], int | None, int]:
        """Read everything now: (closing events, close code or None, events read). Stops after `idle` s of
        silence or at the close."""
        closing: list[dict[str, Any]] = []
        count = 0
        self.sock.settimeout(idle)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(1 << 20)
            except (TimeoutError, OSError):
                break
            if not data:
                self.proto.receive_eof()
            else:
                self.proto.receive_data(data)
            for frame in self.proto.events_received():
                if isinstance(frame, Frame) and frame.opcode is Opcode.TEXT:
                    count += 1
                    if b'"duplex.session.closing"' in frame.data:
                        closing.append(json.loads(bytes(frame.data)))
            if self.proto.close_rcvd is not None or not data:
                break
        code = self.proto.close_rcvd.code if self.proto.close_rcvd is not None else None
        self.close_reason = self.proto.close_rcvd.reason if self.proto.close_rcvd is not None else ""
        return closing, code, count

    def close(self) -> None:
        self.sock.close()
