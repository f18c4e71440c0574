"""Where bench.reliability.fuzz sends its cases: a WebSocket session, a WebRTC data channel, fresh WebSocket
connections, and the WebRTC signalling endpoints. Each `run(case)` returns what the server did.

Message targets know when the server has answered a case with a *probe*: right after the case they
send `{"type": "fuzz.probe", "event_id": ID}`, whose `unknown_event_type` error names ID; a session
handles its messages in order, so every answer to the case has arrived before that error. A probe
that never comes back means the session's reader (or the whole loop) is dead or stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bench.reliability._fuzz_cases import Case
from bench.wsclient import open_session, opening, set_session
from server.auth import RESUME_HEADER, RESUME_SUBPROTOCOL_PREFIX

T = TypeVar("T")
PROBE_TIMEOUT = 5.0  # seconds for a probe's answer; an echo server answers in milliseconds
DC_PROBE_TIMEOUT = 3.0  # a dead data-channel reader costs this per case, and a new call after it
_probe_ids = itertools.count(1)


@dataclass
class Outcome:
    errors: list[str] = field(default_factory=list)  # error codes the case got (probe answers excluded)
    closed: int | None = None  # close code when the server ended the connection (-1: no close frame)
    told: bool = False  # duplex.session.closing came before the close
    timeout: bool = False  # the probe never came back
    http_status: int | None = None
    http_code: str | None = None  # error.code of an HTTP error body
    detail: str = ""
    log: str = ""  # the server's log line for what went wrong (traceback head and exception), if any

    def record_close(self, ws: ClientConnection) -> None:
        """The server ended the connection: keep its close code and reason (-1: no close frame)."""
        rcvd = ws.protocol.close_rcvd
        self.closed = rcvd.code if rcvd is not None else -1
        self.detail = rcvd.reason if rcvd is not None else "no close frame"


class LoopThread:
    """An asyncio loop on its own thread, so that Hypothesis (synchronous) can drive async clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


def _chunk(seed: int) -> bytes:
    x = np.random.default_rng(seed).integers(-20000, 20000, 4800).astype("<i2")
    x[x == 0] = 1
    return x.tobytes()


class WsTarget:
    """One long-lived fuzz session on /v1/realtime (pace media, audio already sent); reopened if it dies."""

    def __init__(self, ws_url: str) -> None:
        self.ws_url = ws_url
        self.ws: ClientConnection | None = None
        self.reconnects = 0

    async def _open(self) -> None:
        ws = await open_session(self.ws_url, max_size=1 << 26)
        await opening(ws)
        await set_session(ws, pace="media")
        await ws.send(_chunk(self.reconnects))  # audio sent: pace and input format are now locked
        self.ws = ws
        out = await self._probe()
        if out.timeout or out.closed is not None or out.errors:
            raise RuntimeError(f"the fuzz session did not start cleanly: {out}")

    async def ensure(self) -> None:
        if self.ws is None:
            await self._open()
            self.reconnects += 1

    async def run(self, case: Case) -> Outcome:
        await self.ensure()
        assert self.ws is not None
        with contextlib.suppress(ConnectionClosed):  # the probe read below records the close
            await self.ws.send(case.payload)
        return await self._probe()

    async def _probe(self) -> Outcome:
        ws = self.ws
        assert ws is not None
        pid = f"probe-{next(_probe_ids)}"
        out = Outcome()
        try:
            await ws.send(json.dumps({"type": "fuzz.probe", "event_id": pid}))
            deadline = time.monotonic() + PROBE_TIMEOUT
            while True:
                msg = await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic()))
                if isinstance(msg, bytes):
                    continue
                if '"error"' not in msg and '"duplex.session.closing"' not in msg:
                    continue  # audio deltas, session.updated...: not what the checks look at
                ev = json.loads(msg)
                if ev.get("type") == "duplex.session.closing":
                    out.told = True
                elif ev.get("type") == "error":
                    err = ev.get("error", {})
                    if err.get("event_id") == pid:
                        return out
                    out.errors.append(str(err.get("code")))
        except ConnectionClosed:
            out.record_close(ws)
        except TimeoutError:
            out.timeout = True
        await self.reset()
        return out

    async def reset(self) -> None:
        """Forget a dead or stuck session (its close is not ours to wait for)."""
        if self.ws is not None:
            self.ws.transport.abort()
            self.ws = None

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(1000), 5)
            self.ws = None


class WsConnTarget:
    """One fresh WebSocket per case: broken frames, client close codes, resume tokens, handshakes."""

    def __init__(self, ws_url: str) -> None:
        self.ws_url = ws_url

    async def run(self, case: Case) -> Outcome:
        p = case.payload
        out = Outcome()
        url = self.ws_url
        kwargs: dict[str, Any] = {"max_size": 1 << 24, "open_timeout": 20, "ping_interval": None}
        if "resume_token" in p:
            # Where clients send it: the header (and, for browsers, a subprotocol); the query is legacy.
            where = p.get("token_in", "header")
            if where == "header":
                kwargs["additional_headers"] = {RESUME_HEADER: p["resume_token"]}
            elif where == "subprotocol":
                kwargs["subprotocols"] = [RESUME_SUBPROTOCOL_PREFIX + p["resume_token"]]
            else:
                url += "?resume_token=" + quote(p["resume_token"], safe="")
        if "subprotocols" in p:
            kwargs["subprotocols"] = p["subprotocols"] or None
            kwargs["additional_headers"] = {"OpenAI-Beta": p["beta"]} if p["beta"] else {}
        kwargs["additional_headers"] = {"X-Duplex-Extensions": "1", **kwargs.get("additional_headers", {})}
        try:
            ws = await connect(url, **kwargs)
        except InvalidStatus as exc:
            out.http_status = exc.response.status_code
            return out
        try:
            if "text_bytes" in p:
                await ws.send(p["text_bytes"], text=True)  # a text frame whose payload is not UTF-8
            elif "close" in p:
                await asyncio.wait_for(ws.recv(), 10)
                await ws.close(p["close"], p["reason"])
                return out
            deadline = time.monotonic() + PROBE_TIMEOUT
            while True:
                msg = await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic()))
                if isinstance(msg, bytes):
                    continue
                ev = json.loads(msg)
                if ev.get("type") == "error":
                    out.errors.append(str(ev.get("error", {}).get("code")))
                elif ev.get("type") == "duplex.session.closing":
                    out.told = True
                elif ev.get("type") == "duplex.session.resume" and "subprotocols" in p:
                    await ws.close(1000)
                    return out
        except ConnectionClosed:
            out.record_close(ws)
        except TimeoutError:
            out.timeout = True
            ws.transport.abort()
        return out

    async def close(self) -> None:
        return None


class HttpTarget:
    """POST /v1/realtime/calls with fuzzed offers; a 201 call is hung up at once (it never connects)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.http: httpx.AsyncClient | None = None

    async def run(self, case: Case) -> Outcome:
        if self.http is None:
            self.http = httpx.AsyncClient(base_url=self.base_url, timeout=30)
        p = case.payload
        out = Outcome()
        try:
            if "hangup" in p:
                r = await self.http.post(f"/v1/realtime/calls/{quote(p['hangup'], safe='')}/hangup")
            else:
                headers = {"Content-Type": p["ctype"]} if p["ctype"] else {}
                r = await self.http.post("/v1/realtime/calls", content=p["body"].encode("utf-8", "surrogatepass"),
                                         headers=headers)
        except httpx.HTTPError as exc:
            out.timeout = True
            out.detail = f"{type(exc).__name__}: {exc}"
            return out
        out.http_status = r.status_code
        if r.status_code == 201:
            call_id = r.headers.get("location", "").rsplit("/", 1)[-1]
            h = await self.http.post(f"/v1/realtime/calls/{call_id}/hangup")
            if h.status_code != 200:
                out.detail = f"hangup of a new call answered {h.status_code}"
        else:
            try:
                out.http_code = r.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                out.detail = f"no JSON error body: {r.text[:120]!r}"
        return out

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()


class DcTarget:
    """A real aiortc peer whose data channel carries the cases (pace realtime, audio sent)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.peer: Any = None
        self.reconnects = 0

    async def ensure(self) -> None:
        if self.peer is not None:
            return
        from bench._rtc_client import RtcClient

        peer = RtcClient(self.base_url)
        await peer.connect(timeout=20)
        self.peer = peer
        self.reconnects += 1
        assert peer._channel is not None
        peer._channel.send(_chunk(self.reconnects))  # audio sent: the input format is locked
        out = await self._probe()
        if out.timeout or out.errors:
            raise RuntimeError(f"the fuzz call did not start cleanly: {out}")

    async def run(self, case: Case) -> Outcome:
        await self.ensure()
        channel = self.peer._channel
        if channel is None or channel.readyState != "open":
            await self.reset()
            return Outcome(closed=-1, detail="data channel closed")
        channel.send(case.payload)
        return await self._probe()

    async def _probe(self) -> Outcome:
        peer = self.peer
        pid = f"probe-{next(_probe_ids)}"
        out = Outcome()
        peer._channel.send(json.dumps({"type": "fuzz.probe", "event_id": pid}))
        deadline = time.monotonic() + DC_PROBE_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                out.timeout = True
                await self.reset()
                return out
            try:
                ev = await asyncio.wait_for(peer._queue.get(), left)
            except TimeoutError:
                continue
            if ev.get("type") == "duplex.session.closing":
                out.told = True
                out.closed = int(ev.get("code", -1))
            elif ev.get("type") == "error":
                err = ev.get("error", {})
                if err.get("event_id") == pid:
                    if out.closed is not None:
                        await self.reset()
                    return out
                out.errors.append(str(err.get("code")))

    async def reset(self) -> None:
        if self.peer is not None:
            with contextlib.suppress(Exception):
                await self.peer.hangup()
            with contextlib.suppress(Exception):
                await self.peer.close()
            self.peer = None

    async def close(self) -> None:
        await self.reset()
