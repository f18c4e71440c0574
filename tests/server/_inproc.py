"""The real app served by uvicorn on a free loopback port, in a thread of the test process.

For tests that need a model the CLI cannot name (one that fails or hangs on cue: the edge of what
cannot be provoked for real). Everything else — routes, runtime, engine, WebSocket — is the real thing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import httpx
import uvicorn

from models.base import InteractionModel
from server.app import create_app
from server.config import ServerConfig
from server.process import DrainingServer
from server.runtime import Runtime
from tests.conftest import free_port

T = TypeVar("T")


class InProcessServer:
    def __init__(self, server: uvicorn.Server, port: int) -> None:
        self._server = server
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}/v1/realtime"

    @property
    def runtime(self) -> Runtime:
        app: Any = self._server.config.loaded_app
        while not hasattr(app, "state"):
            app = app.app
        runtime: Runtime = app.state.runtime
        return runtime

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server's event loop (its state belongs to that loop) and return its result."""
        loop = self.runtime.engine._loops[0].get_loop()

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result(5)


@contextmanager
def serve_in_thread(model: InteractionModel, **config: Any) -> Iterator[InProcessServer]:
    port = free_port()
    cfg = ServerConfig(**{"port": port, "model": model.name, "background": "none", **config})  # config may name one
    # The CLI's server class: on shutdown it drains (tells every session why) before uvicorn closes sockets.
    server = DrainingServer(uvicorn.Config(create_app(cfg, model), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="duplex-inproc", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("in-process server did not start")
        time.sleep(0.05)
    try:
        yield InProcessServer(server, port)
    finally:
        server.should_exit = True
        thread.join(20)


def healthz(url: str) -> tuple[int, dict[str, Any]]:
    r = httpx.get(url + "/healthz", timeout=5)
    return r.status_code, r.json()
