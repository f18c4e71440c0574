"""Bounds on a connection before it is a request: a deadline for the request to arrive, a head size, a
WebSocket message size.

uvicorn closes a keep-alive connection idle between requests, but nothing else: a connection that sends
nothing, or half a request, or a body that never ends, stays open for good and holds a socket, buffers
and a place among the server's connections, before any authentication (slowloris). Here every request
must arrive whole, head and body, within `timeout` seconds of the connection opening or of its first
byte (later requests on a kept-alive connection), and its head (request line and headers) within
`max_head_bytes`. A request that has arrived is never cut, however long the app takes; a connection
upgraded to a WebSocket is no longer watched (the WebSocket's own pings and the session's bounds take
over). A WebSocket message far over the server's frame limit closes the connection as soon as its
frame header declares it, instead of being buffered first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0  # a request's head and body, from the connection opening or the request's first byte
MAX_HEAD_BYTES = 64 * 1024  # request line and headers; browsers send under 8 kB
# WebSocket messages: a message somewhat over --max-frame-bytes is read and answered with a
# `frame_too_large` error (the session goes on, and the client learns the limit); one over this many
# times the limit closes the connection (1009) before it is read.
WS_MESSAGE_SLACK = 2


class _RequestDeadline(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP protocol (httptools or h11, whichever it picked), with the deadline and head bound."""

    request_timeout: float = REQUEST_TIMEOUT_S
    max_head_bytes: int = MAX_HEAD_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._left_us() or self.transport.is_closing():
            self._disarm()
            return
        if self._request_arrived():
            self._disarm()
            self._head_bytes = 0
            return
        if self._awaiting_head():
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                log.info("closing a connection whose request head passed %d bytes", self.max_head_bytes)
                self._disarm()
                self.transport.close()
                return
        if self._deadline is None:  # the first byte of a request on a kept-alive connection
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._deadline = asyncio.get_running_loop().call_later(self.request_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _left_us(self) -> bool:
        """Upgraded: the transport now feeds a WebSocket protocol."""
        return bool(self.transport.get_protocol() is not self)

    def _cycle(self) -> Any:
        return getattr(self, "cycle", None)

    def _awaiting_head(self) -> bool:
        cycle = self._cycle()
        return cycle is None or bool(cycle.response_complete)

    def _request_arrived(self) -> bool:
        """A request whose head and body have both arrived is being answered."""
        cycle = self._cycle()
        return cycle is not None and not cycle.response_complete and not cycle.more_body

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._left_us() or self._request_arrived():
            return
        log.info("closing a connection that did not send a whole request within %.0f s", self.request_timeout)
        self.transport.close()


def request_deadline_protocol(timeout: float = REQUEST_TIMEOUT_S,
                              max_head_bytes: int = MAX_HEAD_BYTES) -> type[asyncio.Protocol]:
    """The HTTP protocol class for uvicorn's `http=` option."""
    return type("RequestDeadlineProtocol", (_RequestDeadline,),
                {"request_timeout": timeout, "max_head_bytes": max_head_bytes})


def uvicorn_options(max_frame_bytes: int) -> dict[str, Any]:
    """The uvicorn.Config options that bound connections, for a server whose frame limit is `max_frame_bytes`."""
    return {"http": request_deadline_protocol(), "ws_max_size": WS_MESSAGE_SLACK * max_frame_bytes}
