"""The FastAPI application: routes, lifespan and middleware."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from models.base import InteractionModel
from server.auth import APIKeyMiddleware
from server.config import ServerConfig
from server.runtime import Runtime
from server.ws import realtime_endpoint

WEB_DIR = Path(__file__).resolve().parents[1] / "web"


def create_app(config: ServerConfig, model: InteractionModel | None = None) -> FastAPI:
    runtime = Runtime(config, model)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(title="duplex", version="0.1.0", lifespan=lifespan)
    app.state.runtime = runtime
    app.add_middleware(APIKeyMiddleware, api_key=config.api_key)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        reg = runtime.registry
        return JSONResponse({
            "status": "draining" if runtime.draining else "ok",
            "model": runtime.model.name if reg is not None else None,
            "sessions": len(reg) if reg is not None else 0,
            "capacity": reg.capacity if reg is not None else 0,
            "pid": os.getpid(),
        }, status_code=503 if runtime.draining else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(runtime.metrics.render(), media_type="text/plain; version=0.0.4")

    app.add_api_websocket_route("/v1/realtime", realtime_endpoint)

    try:
        from server.webrtc import register_webrtc
    except ImportError:
        pass
    else:
        register_webrtc(app, runtime)

    if (WEB_DIR / "index.html").exists():
        app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")

        @app.get("/", include_in_schema=False)
        async def index() -> RedirectResponse:
            return RedirectResponse("/static/index.html")

    return app
