"""A server going away (SIGTERM, SIGINT, `stop`): what it refuses meanwhile, and the grace it gives its
sessions (`--drain-grace S`: a replica behind a proxy), during which their clients are told to finish
or to reconnect elsewhere."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from server import protocol as p
from server.metrics import Metrics
from server.sessions import Refused, Session

POLL = 0.1  # seconds between looks at the sessions left during a drain's grace


class Drain:
    def __init__(self) -> None:
        self.active = False  # no new session from now on
        self.done = asyncio.Event()  # set once the sessions are being closed: transports stop waiting on slow clients
        self._grace_until: float | None = None  # monotonic end of the grace, while it runs

    def refusal(self, resume_token: str | None, moving: bool) -> Refused | None:
        """Why a connection is refused during a drain (None: it is not). `moving`: sessions are handed
        to the session store, where another replica takes them."""
        if not self.active:
            return None
        if moving and resume_token:
            # Its session was handed to the store when its connection ended: another replica takes it.
            return Refused("session_moving", "this server is going away and has handed your session on; "
                           "reconnect with the same token (the proxy sends you to another server)", 503, 1013,
                           {"Retry-After": "1"})
        if resume_token and self._grace_until is not None:
            return None  # during the grace a dropped session may still come back to finish here
        return Refused("server_shutting_down", "server is shutting down; reconnect later", 503, 1013)

    async def grace(self, sessions: Callable[[], list[Session]], reason: str, seconds: float, moving: bool,
                    metrics: Metrics) -> None:
        """Tell every session's client (`duplex.session.draining`, with its resume token and the seconds
        left), then wait up to `seconds` for their clients to close them."""
        self._grace_until = time.monotonic() + seconds
        metrics.drains.inc()
        for session in sessions():
            session.emit({"type": "duplex.session.draining", "event_id": p.new_id("event"), "reason": reason,
                          "seconds_left": seconds, "resume_token": session.resume_token, "reconnect": moving,
                          "message": "this server is going away: reconnect with your resume token and the "
                          "session continues on another server" if moving else "this server is going away: "
                          "finish, or open a new session (the proxy sends it to another server); what is left "
                          "is closed when the time is up"})
        try:
            while sessions() and time.monotonic() < self._grace_until:
                await asyncio.sleep(POLL)
        finally:
            self._grace_until = None
