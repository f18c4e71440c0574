"""uvicorn's WebSocket protocol with a keepalive that only judges a client by what the server has read.

uvicorn stops reading a connection while the app holds an unread message (it pauses the transport until
the app asks for the next one). A media-pace session that waits for room in its input does exactly that,
and a client that sends a long file at once has its pong queued behind the audio the server has not
read yet: uvicorn's keepalive then closed it (1011 "keepalive ping timeout") although it was answering
every ping. Here a pong deadline counts only time the server was reading: when it passes, it is moved on
by as long as reading was paused since the ping (the pong may be behind input the server had not read).
A client that is really gone, or sends but never answers, is closed as before: its pauses are short
(the app reads each message at once), so its deadline runs out.
"""

from __future__ import annotations

from uvicorn._types import ASGIReceiveEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

MIN_REARM_S = 0.05


class PatientKeepalive(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol (what its `ws="auto"` picks with `websockets` installed)."""

    _paused_at: float | None = None  # when reading was last paused, while it still is
    _paused_for = 0.0  # seconds reading was paused since the pong deadline was (re)armed, ended pauses
    _reading_left = 0.0  # seconds of reading the pong may still take
    _armed_at = 0.0  # when the pong deadline was last (re)armed

    def send_receive_event_to_app(self) -> None:
        super().send_receive_event_to_app()
        if self.read_paused and self._paused_at is None:
            self._paused_at = self.loop.time()

    async def receive(self) -> ASGIReceiveEvent:
        message = await super().receive()
        if not self.read_paused and self._paused_at is not None:
            self._paused_for += self.loop.time() - self._paused_at
            self._paused_at = None
        return message

    def send_keepalive_ping(self) -> None:
        self._rearmed()
        self._reading_left = self.ping_timeout or 0.0
        super().send_keepalive_ping()

    def keepalive_timeout(self) -> None:
        now = self.loop.time()
        paused = self._paused_for + (now - self._paused_at if self._paused_at is not None else 0.0)
        self._reading_left -= max(0.0, now - self._armed_at - paused)
        if self._reading_left > 0 and not (self.close_sent or self.transport.is_closing()):
            # Same ping, same payload: the deadline moves on by the time the server was not reading
            # (at least MIN_REARM_S, so a long pause is not a busy loop of timers).
            self._rearmed()
            self.pong_timer = self.loop.call_later(max(self._reading_left, MIN_REARM_S), self.keepalive_timeout)
            return
        super().keepalive_timeout()

    def _rearmed(self) -> None:
        self._armed_at = self.loop.time()
        self._paused_for = 0.0
        if self._paused_at is not None:
            self._paused_at = self._armed_at
