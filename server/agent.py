"""HAProxy's agent check: a TCP port that answers one line with this replica's state, then closes.

HAProxy connects every `agent-inter` and reads the line (haproxy 2.6 configuration manual, "agent-check"):
`up ready maxconn:N` while there is room for a new session (N = the capacity), `up drain maxconn:N` when
every place is held (weight 0: no new session is sent here, but a resume that names this replica still is),
`drain` while the server drains, `down` while it is unhealthy. The figures are the runtime's, the same
that `/healthz` reports (`Runtime.load`). A connection that is not answered in time is closed, so a
stuck client cannot pile up here.

The proxy's resume backend (deploy/haproxy.py) asks with `agent-send "resume"`: it routes resumes whose
replica is down, so it is answered from the room for a *restored* session (capacity plus the restore
reserve, `Load.restore_room`) instead of the room for a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from server.sessions import Load

log = logging.getLogger(__name__)

WRITE_TIMEOUT = 1.0  # seconds for HAProxy to take the line
READ_TIMEOUT = 0.3  # seconds to wait for what HAProxy sends first (agent-send); none: a new-session check
RESUME = "resume"  # agent-send of the resume backend


def agent_line(load: Load, resume: bool = False) -> str:
    """The agent's answer for these figures (one line, newline-terminated); `resume`: for the proxy's
    resume backend, whose sessions may take the restore reserve."""
    if load.problem:
        return "down\n"
    if load.moving:
        # Its sessions are handed on: a resume must go to another replica, which `drain` would not do
        # (use-server still picks a draining server). Live connections are not cut by a down state.
        return "down\n"
    if load.draining:
        return "drain\n"
    # `maxconn` stays the capacity: every connection is one session, attached or resuming (a resume
    # uses the place its detached session kept). What is full is the room for *new* sessions: weight
    # 0 then, so none is sent here (and when every replica is full the proxy answers 503 at once),
    # while a resume that names this replica still reaches it.
    if resume:
        state = "ready" if load.restore_room > 0 else "drain"
        return f"up {state} maxconn:{load.capacity + load.reserve}\n"
    state = "ready" if load.free > 0 else "drain"
    return f"up {state} maxconn:{load.capacity}\n"


class AgentServer:
    """Start with `await start()`, stop with `await stop()`; `port` is the bound port (0 asks the OS)."""

    def __init__(self, host: str, port: int, load: Callable[[], Load]) -> None:
        self.host = host
        self.port = port
        self._load = load
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._answer, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("agent check answering on %s:%d", self.host, self.port)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                asked = (await asyncio.wait_for(reader.readline(), READ_TIMEOUT)).decode(errors="replace").strip()
            except (TimeoutError, asyncio.IncompleteReadError):
                asked = ""  # HAProxy without agent-send writes nothing: the new-session answer
            writer.write(agent_line(self._load(), resume=asked == RESUME).encode())
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        except (TimeoutError, OSError):
            pass  # HAProxy went away; it will ask again
        finally:
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), WRITE_TIMEOUT)
            self._server = None
