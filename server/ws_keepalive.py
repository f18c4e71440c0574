"""uvicorn's WebSocket protocol with a keepalive that only judges a client by what the server has read.

uvicorn stops reading a connection while the app holds an unread message (it pauses the transport until
the app asks for the next one). A media-pace session that waits for room in its input does exactly that,
and a client that sends a long file at once has its pong queued behind the audio the server has not
read yet: uvicorn's keepalive then closed it (1011 "keepalive ping timeout") although it was answering
every ping. Here a pong deadline that passes while reading was paused at any moment since the ping is
not held against the client: the deadline starts again. A client that is really gone sends nothing,
so the server never pauses for it and the deadline closes it as before.
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class PatientKeepalive(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol (what its `ws="auto"` picks with `websockets` installed)."""

    _paused_since_ping = False  # the server stopped reading at some moment since the pong deadline began

    def send_receive_event_to_app(self) -> None:
        super().send_receive_event_to_app()
        if self.read_paused:
            self._paused_since_ping = True

    def send_keepalive_ping(self) -> None:
        self._paused_since_ping = self.read_paused
        super().send_keepalive_ping()

    def keepalive_timeout(self) -> None:
        waiting = self.read_paused or self._paused_since_ping
        if waiting and self.ping_timeout is not None and not (self.close_sent or self.transport.is_closing()):
            # The pong may be behind input the server has not read: wait for it again, same ping.
            self._paused_since_ping = self.read_paused
            self.pong_timer = self.loop.call_later(self.ping_timeout, self.keepalive_timeout)
            return
        super().keepalive_timeout()
