"""The FastAPI application: routes, the one lifespan, and middleware."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from models.base import InteractionModel
from server import client_secrets
from server.auth import APIKeyMiddleware
from server.client_rate import NewSessionRateLimit
from server.config import ServerConfig
from server.cors import CORS
from server.host_check import HostCheck, allowed_names
from server.live.census import census
from server.live.endpoint import PATH as LIVE_PATH
from server.live.endpoint import live_endpoint
from server.runtime import Runtime
from server.unread_body import ReadBodyBeforeAnswer
from server.ws import realtime_endpoint

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
log = logging.getLogger(__name__)


def _webrtc_installed() -> bool:
    """aiortc (and PyAV) are optional; any other ImportError in our WebRTC code is a bug and is raised."""
    try:
        import aiortc  # noqa: F401
        import av  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name in ("aiortc", "av"):
            log.warning("WebRTC disabled: %s is not installed (pip install aiortc)", exc.name)
            return False
        raise
    return True


def freeze_startup_objects() -> None:
    """Move everything alive after start-up (modules, the model, the app) out of the cyclic collector's sight.

    A full collection scans every tracked object: 60,000 after start-up with echo, 200,000 once torch
    is imported, which paused the event loop for 29 ms and 97 ms (measured) in the middle of real-time
    micro-turns. Frozen, the start-up objects are neither scanned nor counted, so a full collection
    costs what the live sessions hold; the reaper runs one every few seconds (server/runtime.py) to
    free finished connections promptly (found by bench.reliability.soak). Frozen objects that later
    become cyclic garbage are never freed; start-up objects live as long as the process anyway.
    """
    gc.collect()  # what start-up left as garbage is freed now, not frozen with the rest
    gc.freeze()
    gc.collect()  # resets the long-lived count CPython compares with (it is updated by full collections only)


def create_app(config: ServerConfig, model: InteractionModel | None = None) -> FastAPI:
    webrtc: Any = None
    if _webrtc_installed():
        from server import webrtc

        ice = webrtc.ice_config(config.ice_servers)  # a bad ICE URL stops the server now, not every call later

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await Runtime.create(config, model)
        app.state.runtime = runtime
        freeze_startup_objects()
        # The WebRTC transport's peers are ended by runtime.stop, after its drain (Calls registers itself).
        app.state.webrtc_calls = webrtc.Calls(runtime, ice) if webrtc is not None else None
        try:
            yield
        finally:
            await runtime.stop()  # drain (every session is told why), transports, engine, reasoner, model

    # The OpenAPI pages only when asked for: /docs loads Swagger UI's script from a CDN into this origin.
    docs: dict[str, Any] = {} if config.api_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="duplex", version="0.1.0", lifespan=lifespan, **docs)
    # Ephemeral keys for browser apps (POST /v1/realtime/client_secrets), taken by the transports.
    secrets_store = client_secrets.ClientSecrets(config.ephemeral_key_ttl, replica_id=config.replica_id)
    app.state.client_secrets = secrets_store
    app.add_middleware(APIKeyMiddleware, api_key=config.api_key, client_secrets=secrets_store)
    # No key to stop a DNS-rebinding page: its Host does (behind a named proxy, the proxy's name is public).
    if config.is_loopback() and not config.api_key and not config.forwarded_allow_ips:
        app.add_middleware(HostCheck, names=allowed_names(config.host, config.allowed_origins))
    # An address's attempts count whether or not they carry the key.
    app.add_middleware(NewSessionRateLimit, per_minute=config.new_sessions_per_minute or 0.0)
    # Outermost: a preflight carries no key, and every answer (a 401, a 429 too) must be readable by an
    # admitted page; the origins are the runtime's, those the WebSocket's Origin check admits.
    app.add_middleware(CORS, origins=lambda: app.state.runtime.allowed_origins)
    # Around everything that may refuse: an answer goes out once the request's body is in (a bounded
    # read), so a refusal is not lost to the reset a close on unread bytes makes (server/unread_body.py).
    app.add_middleware(ReadBodyBeforeAnswer)

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        runtime: Runtime = request.app.state.runtime
        load = runtime.load()  # the same figures the proxy's agent check reads (server/agent.py)
        status = "draining" if load.draining else ("unhealthy" if load.problem else "ok")
        # Sessions being opened count: they hold a place, and admission counts them.
        body: dict[str, Any] = {"status": status, "model": runtime.model.name, "sessions": load.sessions,
                                "capacity": load.capacity, "attached": load.attached, "free": load.free,
                                "replica": runtime.tokens.replica_id, "pid": os.getpid()}
        if runtime.claims is not None:
            # Down, sessions go on here and new ones are admitted; only moving them to another replica
            # stops working, so this does not make the replica unhealthy.
            body["store"] = "ok" if runtime.claims.store.reachable else "unreachable"
        if load.problem:
            body["problem"] = load.problem
        return JSONResponse(body, status_code=503 if load.draining or load.problem else 200)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        m = request.app.state.runtime.metrics
        m.asyncio_tasks.set(len(asyncio.all_tasks()))  # a task leak shows as this growing over a soak
        m.count_sessions(census(request.app.state.runtime.registry.sessions()))  # duplex_protocol_sessions
        return Response(m.render(), media_type="text/plain; version=0.0.4")

    client_secrets.register_routes(app, secrets_store)
    app.add_api_websocket_route("/v1/realtime", realtime_endpoint)
    app.add_api_websocket_route(LIVE_PATH, live_endpoint)  # GPT-Live (docs/live.md)
    if webrtc is not None:
        webrtc.register_routes(app)
        from server.live import rtc as live_rtc  # GPT-Live's WebRTC door (docs/live.md), on the same calls

        live_rtc.register_routes(app)

    if (WEB_DIR / "index.html").exists():
        app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")

        @app.get("/", include_in_schema=False)
        async def index() -> RedirectResponse:
            return RedirectResponse("/static/index.html")

    return app


def started_runtime(app: Any) -> Runtime | None:
    """The runtime of an app made by `create_app` once its lifespan has started it; else None."""
    while app is not None and not isinstance(app, FastAPI):  # uvicorn may wrap it in middlewares
        app = getattr(app, "app", None)
    runtime = getattr(app.state, "runtime", None) if app is not None else None
    return runtime if isinstance(runtime, Runtime) else None
