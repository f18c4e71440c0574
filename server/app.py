"""The FastAPI application: routes, the one lifespan, and middleware."""

from __future__ import annotations

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
from server.auth import APIKeyMiddleware
from server.config import ServerConfig
from server.runtime import Runtime
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


def create_app(config: ServerConfig, model: InteractionModel | None = None) -> FastAPI:
    webrtc: Any = None
    if _webrtc_installed():
        from server import webrtc

        ice = webrtc.ice_config(config.ice_servers)  # a bad ICE URL stops the server now, not every call later

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await Runtime.create(config, model)
        app.state.runtime = runtime
        calls = webrtc.Calls(runtime, ice) if webrtc is not None else None
        app.state.webrtc_calls = calls
        try:
            yield
        finally:
            await runtime.drain("server shutting down")  # every session is told why, then closed
            if calls is not None:
                await calls.close_all()
            await runtime.stop()

    app = FastAPI(title="duplex", version="0.1.0", lifespan=lifespan)
    app.add_middleware(APIKeyMiddleware, api_key=config.api_key)

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        runtime: Runtime = request.app.state.runtime
        reg = runtime.registry
        problem = runtime.health()
        status = "draining" if runtime.draining else ("unhealthy" if problem else "ok")
        body: dict[str, Any] = {"status": status, "model": runtime.model.name, "sessions": len(reg),
                                "capacity": reg.capacity, "pid": os.getpid()}
        if problem:
            body["problem"] = problem
        return JSONResponse(body, status_code=503 if runtime.draining or problem else 200)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(request.app.state.runtime.metrics.render(), media_type="text/plain; version=0.0.4")

    app.add_api_websocket_route("/v1/realtime", realtime_endpoint)
    if webrtc is not None:
        webrtc.register_routes(app)

    if (WEB_DIR / "index.html").exists():
        app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")

        @app.get("/", include_in_schema=False)
        async def index() -> RedirectResponse:
            return RedirectResponse("/static/index.html")

    return app
