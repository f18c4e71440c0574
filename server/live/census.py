"""Which protocol and transport each held session is on, for the `duplex_protocol_sessions` gauge.

Counted when /metrics is read rather than kept up to date at every attach and detach: the sessions are
few and the registry already holds them, and a count made from them cannot drift.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from server.live.context import LiveContext
from server.sessions import Session


def protocol_of(session: Session) -> str:
    """A GPT-Live session holds its LiveContext as its background hook from its first bind to its end."""
    return "live" if isinstance(session.background, LiveContext) else "realtime"


def transport_of(session: Session) -> str:
    """Only a WebRTC call gives its connection an output track of its own (`audio_out`)."""
    sink = session.sink
    if sink is None:
        return "detached"
    return "webrtc" if getattr(sink, "audio_out", None) is not None else "websocket"


def census(sessions: Iterable[Session]) -> Iterator[tuple[str, str]]:
    for session in sessions:
        if not session.closed:
            yield protocol_of(session), transport_of(session)
