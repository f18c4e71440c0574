"""The server process: uvicorn with a drain first on SIGTERM/SIGINT, TCP_USER_TIMEOUT and TCP_NOTSENT_LOWAT
on its listening sockets, and resume tokens kept out of its logs.

`serve(config)` runs it until it stops (server/cli.py: `duplex serve` parses the options into the config).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

from server.auth import redact_query
from server.config import ServerConfig
from server.connection_limits import uvicorn_options
from server.limits import TCP_NOTSENT_LOWAT_BYTES, TCP_USER_TIMEOUT_S
from server.ws_keepalive import PatientKeepalive


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain step first on SIGTERM/SIGINT: live sessions are told why and closed cleanly;
    and TCP_USER_TIMEOUT on its listening sockets, so a stalled client connection cannot be held forever,
    and TCP_NOTSENT_LOWAT, so what a client does not read backs up into its outbox (and cuts it) instead of
    into a send buffer the kernel grows to megabytes."""

    def __init__(self, config: uvicorn.Config, stalled_connection_s: float = TCP_USER_TIMEOUT_S) -> None:
        super().__init__(config)
        self.stalled_connection_s = stalled_connection_s

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the captured signal after shutdown, so the process would die "by SIGTERM"
        # even after a clean drain. We drain and exit 0 instead, which is what a supervisor expects
        # from a graceful stop.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # Connections accepted from now on inherit this from the listening socket (Linux).
        for srv in getattr(self, "servers", []):
            for sock in srv.sockets:
                if sock.family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "TCP_USER_TIMEOUT"):
                    ms = int(self.stalled_connection_s * 1000)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, ms)
                if sock.family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "TCP_NOTSENT_LOWAT"):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, TCP_NOTSENT_LOWAT_BYTES)

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        from server.app import started_runtime

        # Before uvicorn closes the sockets and waits for the connections: they carry the goodbyes.
        # The rest of the shutdown (transports, engine, model) is the runtime's stop, in the lifespan.
        runtime = started_runtime(self.config.loaded_app)
        if runtime is not None:
            await runtime.drain("server shutting down")
        await super().shutdown(sockets)


class RedactTokens(logging.Filter):
    """Keeps resume tokens (a credential for a session) out of the logs when an older client sends one
    in the query string: `resume_token=...` becomes `resume_token=<redacted>`, however its name is
    percent-encoded (server/auth.py: redact_query)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        return True


def uvicorn_config(app: Any, config: ServerConfig) -> uvicorn.Config:
    """uvicorn's settings for `app` served as `config` says (tests that serve in a thread use it too)."""
    return uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                          **uvicorn_options(config.max_frame_bytes), ws=PatientKeepalive,
                          ws_ping_interval=config.ws_ping_interval or None, ws_ping_timeout=config.ws_ping_timeout,
                          timeout_graceful_shutdown=10, ws_per_message_deflate=config.ws_compression,
                          # uvicorn trusts X-Forwarded-For from loopback by default: only named proxies here.
                          proxy_headers=bool(config.forwarded_allow_ips),
                          forwarded_allow_ips=",".join(config.forwarded_allow_ips) or "127.0.0.1")


def serve(config: ServerConfig) -> int:
    from server.app import create_app

    try:
        config.check()
    except ValueError as exc:
        print(f"duplex: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from models import heap

    heap.tune_for_server()  # before the model's worker threads allocate (models/heap.py says why)
    uv = uvicorn_config(create_app(config), config)
    for name in ("uvicorn.access", "uvicorn.error"):  # access lines and WebSocket "[accepted]" lines
        logging.getLogger(name).addFilter(RedactTokens())
    server = DrainingServer(uv, config.stalled_connection_s)
    from server.memdebug import install_from_env

    install_from_env()  # DUPLEX_TRACEMALLOC=PATH: memory reports on SIGUSR1 (off by default)
    server.run()
    return 0 if server.started else 1
