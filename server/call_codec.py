"""What a WebRTC call needs of a protocol's connection (`CallCodec`), and the Realtime connection as one.

A call (server/_rtc_call.py) moves audio, video and data-channel messages; what the messages mean, and
how the session's output becomes events, is the protocol's. `RealtimeCodec` adapts the Realtime
connection (`POST /v1/realtime/calls`); the GPT-Live one is server/live/rtc.py's `LiveCodec`.
"""

from __future__ import annotations

from typing import Protocol

from server._rtc_tracks import PacedAudioTrack
from server.outbox import Outbox
from server.protocol import ProtocolError
from server.realtime import RealtimeConnection
from server.runtime import Runtime
from server.sessions import Ended, OutputSink, Session
from streaming.pcm import Audio
from streaming.video import Frame


class CallCodec(Protocol):
    """What a call needs of a protocol's connection: its events in and out, its session, its audio."""

    protocol: str  # "realtime" or "live", for the metrics
    outbox: Outbox  # events (JSON text) and the final Close, for the data channel

    @property
    def sink(self) -> OutputSink:
        """The session's output sink (what the runtime attaches and detaches)."""
        ...

    @property
    def session(self) -> Session: ...

    @property
    def session_id(self) -> str | None: ...

    @property
    def pings(self) -> bool:
        """Whether the call sends `duplex.ping` (a duplex event) on the data channel."""
        ...

    async def handle_message(self, msg: str | bytes) -> None:
        """One data-channel message (keepalives are answered by the call before this)."""

    def report(self, code: str, message: str) -> None:
        """An `error` event in the protocol's shape (the session goes on)."""

    def end(self, code: int, reason: str) -> None:
        """The server hangs up on the client (say why, then Close)."""

    def push_audio(self, audio: Audio) -> None:
        """Real-time RTP audio, 24 kHz mono float32."""

    def push_video(self, frame: Frame) -> None:
        """The newest camera frame of a video track."""

    def ended(self, peer_seen: bool) -> Ended:
        """How the session's connection ended when the call ends (the runtime detaches it so)."""
        ...

    def release(self) -> None:
        """The transport is done: free what the connection holds."""


class RealtimeCodec:
    """The Realtime connection as a call's codec; pace 'media' is not served over WebRTC."""

    protocol = "realtime"

    def __init__(self, runtime: Runtime, track: PacedAudioTrack, extensions: bool) -> None:
        self.runtime = runtime
        self.conn = RealtimeConnection(runtime, audio_out=track, media_ok=False)
        self.conn.extensions = extensions  # duplex's events only for a client that asked (server/extensions.py)
        self.outbox = self.conn.outbox

    @property
    def sink(self) -> OutputSink:
        return self.conn

    @property
    def session(self) -> Session:
        return self.conn.session

    @property
    def session_id(self) -> str | None:
        return self.conn.session_id

    @property
    def pings(self) -> bool:
        return True  # the page's round-trip readout; Realtime clients ignore the event

    async def handle_message(self, msg: str | bytes) -> None:
        if isinstance(msg, bytes):
            await self.conn.handle_audio_bytes(msg)  # raw PCM16, as binary WebSocket frames
        else:
            await self.conn.handle_text(msg)

    def report(self, code: str, message: str) -> None:
        self.conn.error(ProtocolError(code, message))

    def end(self, code: int, reason: str) -> None:
        self.conn.end(code, reason)

    def push_audio(self, audio: Audio) -> None:
        # RTP arrives in real time; an overrun (a stalled loop catching up) is counted and reported on
        # the data channel, as a WebSocket client's is.
        self.runtime.push_live_audio(self.conn.session, audio)

    def push_video(self, frame: Frame) -> None:
        self.runtime.push_video(self.conn.session, frame)  # the next micro-turn takes the newest one

    def ended(self, peer_seen: bool) -> Ended:
        # A peer that never connected never got the greeting (nor the rotated token): the runtime gives
        # a resumed session its old token back, and frees a new one at once.
        return Ended.DROPPED if peer_seen else Ended.NEVER_CONNECTED

    def release(self) -> None:
        self.conn.release()
