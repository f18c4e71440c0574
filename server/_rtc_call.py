"""One WebRTC call: a peer connection bound to one session, for as long as the peer is alive.

    peer --Opus--> read_audio -> Runtime.push_live_audio (the WebSocket's real-time path)
    engine -> RealtimeConnection.deliver -> PacedAudioTrack (its AudioOutput) --Opus--> peer
    peer --video-> read_video -> Runtime.push_video
    peer <-JSON--> data channel <-> the protocol's connection (the same event codec as its WebSocket,
                                    given this call's PacedAudioTrack as its audio output)

The call does not know the protocol: it talks to a `CallCodec` (server/call_codec.py: the Realtime
connection's `RealtimeCodec`; server/live/rtc.py's `LiveCodec` for `POST /v1/live/sessions`).

Lifecycle (CallState): the session is attached (Runtime.attach) before the offer is answered; NEW
while it is answered, LIVE once the call's tasks run, ENDED after `finish`. aiortc has no
"disconnected" state and its ICE consent check takes ~30 s to fail, so the call keeps its own
liveness: anything from the peer (RTP media, data-channel messages, the `duplex.pong` answering our
`duplex.ping`) counts; LIVENESS_TIMEOUT without any of it and the peer is dead. A call that ends
without a hang-up detaches its session, which can then be resumed with its token within the grace
period, exactly like a dropped WebSocket; a call whose peer never showed any life
(`--rtc-connect-timeout`) closes a new session at once, or gives a resumed one its old token back
(the rotated one never reached the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict
from enum import Enum
from typing import Any

from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCSessionDescription

from server import protocol as p
from server._rtc_tracks import PacedAudioTrack, read_audio, read_video, use_low_latency_buffer
from server.call_codec import CallCodec
from server.limits import RTC_INBOX_BYTES
from server.outbox import Close
from server.protocol import ProtocolError
from server.rtc_bounds import bound_sctp, bound_video_decoding
from server.runtime import Runtime
from server.sessions import OutputSink, Session
from streaming.pcm import Audio
from streaming.video import Frame

log = logging.getLogger(__name__)

PING_INTERVAL = 1.0  # seconds between duplex.ping events on the data channel
LIVENESS_TIMEOUT = 5.0  # seconds without anything from the peer before it is declared dead
PENDING_EVENTS = 512  # events kept while the data channel is not open yet (the oldest are dropped)
CHANNEL_BUFFER_LIMIT = 8 << 20  # bytes queued on a data channel that is not read before we hang up
FLUSH_TIMEOUT = 1.0  # seconds to let the last events (session.closing) leave before closing the peer


class CallState(Enum):
    NEW = "new"  # offer being answered; session not attached yet
    LIVE = "live"  # session attached; media and events flow
    ENDED = "ended"  # peer connection closed; the session is detached or closed


@contextlib.contextmanager
def _offer_faults() -> Iterator[None]:
    """aiortc trusts an offer's structure: a media section without its DTLS parameters (no a=fingerprint /
    a=setup) fails in setRemoteDescription, one whose m= line is gone (its attributes merged into the
    section before) fails in createAnswer, both with AttributeError. Those are the offer's fault (found by
    bench.reliability.fuzz): invalid_sdp. So is an `a=fmtp` line whose `a=rtpmap` is gone: a StopIteration inside
    aiortc's coroutine, which Python re-raises as RuntimeError. The peer connection is fresh and only
    the offer is applied here, so these come from the offer. ValueError and AssertionError are turned
    into invalid_sdp by the caller."""
    try:
        yield
    except (AttributeError, KeyError, IndexError, TypeError, StopIteration, RuntimeError) as exc:
        raise ProtocolError("invalid_sdp", f"the SDP offer could not be used ({type(exc).__name__}: "
                            f"{str(exc)[:120]}); send the offer exactly as RTCPeerConnection.createOffer() "
                            "produced it") from None


class RtcCall:
    """`codec(track)` makes the protocol's connection, given this call's output track."""

    def __init__(self, runtime: Runtime, pc: RTCPeerConnection, codec: Callable[[PacedAudioTrack], CallCodec],
                 on_end: Callable[[RtcCall], None] | None = None) -> None:
        self.runtime = runtime
        self.pc = pc
        self.state = CallState.NEW
        self._on_end = on_end  # told once when the call has ended (the endpoint forgets it)
        self.connect_timeout = runtime.config.rtc_connect_timeout
        self.track = PacedAudioTrack()
        self.codec = codec(self.track)
        self.channel: RTCDataChannel | None = None
        self.started = time.monotonic()
        self.last_seen: float | None = None  # monotonic time of the last sign of life from the peer
        self._pending: deque[str] = deque(maxlen=PENDING_EVENTS)  # events waiting for the channel to open
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue()  # data-channel messages, in order
        self._inbox_bytes = 0  # bounded by RTC_INBOX_BYTES
        self._last_inbox_error = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._ended = asyncio.Event()
        self._wire()

    @property
    def conn(self) -> OutputSink:
        """The session's sink: what the runtime attaches, and how a call is found from its session."""
        return self.codec.sink

    @property
    def session(self) -> Session:
        return self.codec.session

    @property
    def session_id(self) -> str | None:
        """The session's id once attached; None for a call refused before it got one."""
        return self.codec.session_id

    # -- setup ----------------------------------------------------------------------------------

    def _wire(self) -> None:
        pc = self.pc

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                self._spawn(read_audio(track, self._push_audio, self.alive), "rtc-audio-in")
            elif track.kind == "video":
                self._spawn(read_video(track, self._store_video, self.alive), "rtc-video-in")

        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            if self.channel is not None:  # one event channel per call; extra ones are ignored
                log.info("call %s: ignoring extra data channel %r", self.session_id, channel.label)
                return
            self.channel = channel
            channel.on("open", self._flush_pending)
            channel.on("message", self._on_message)
            if channel.readyState == "open":
                self._flush_pending()

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.finish(f"peer connection {pc.connectionState}")

    def _on_message(self, msg: str | bytes) -> None:
        """A data-channel message: queue it for the reader, within RTC_INBOX_BYTES (else drop and say so)."""
        if self._inbox_bytes + len(msg) > RTC_INBOX_BYTES:
            self.runtime.metrics.dropped_event("inbox_full", self.codec.protocol)
            now = time.monotonic()
            if now - self._last_inbox_error > 1.0:
                self._last_inbox_error = now
                self.codec.report("inbox_full", f"over {RTC_INBOX_BYTES} bytes of data-channel messages are "
                                  "waiting to be handled; a message was dropped. Send less at once")
            return
        self._inbox_bytes += len(msg)
        self._inbox.put_nowait(msg)

    async def answer(self, offer_sdp: str) -> str:
        """Apply the offer, attach the output track, and return the answer SDP (ICE candidates included)."""
        with _offer_faults():
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        bound_sctp(self.pc, self._flooded)
        bound_video_decoding()
        if not any(t.kind == "audio" for t in self.pc.getTransceivers()):
            raise ProtocolError("offer_without_audio", "the offer has no audio m-line: add a microphone "
                                "track (or addTransceiver('audio')) before creating the offer")
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "audio" and not use_low_latency_buffer(transceiver.receiver):
                log.warning("could not replace aiortc's audio jitter buffer: input latency is 80 ms higher")
        self.pc.addTrack(self.track)
        with _offer_faults():  # what the offer set up is used here: a broken one fails only now
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        return str(self.pc.localDescription.sdp)

    def _flooded(self, why: str) -> None:
        """The peer sent past what aiortc may hold for it (server/rtc_bounds.py): no legal peer does, so
        the session ends with the call (no resume grace to hold its place)."""
        self.runtime.metrics.dropped_event("rtc_flood", self.codec.protocol)
        self._spawn(self._end_flooded(why), "rtc-flood")

    async def _end_flooded(self, why: str) -> None:
        if self.state is CallState.LIVE:
            await self.runtime.close(self.session, why, 1008)
        await self.finish(why)

    def start(self) -> None:
        """The session is attached to this call: start moving events and watching the peer."""
        self.state = CallState.LIVE
        self._spawn(self._write_loop(), "rtc-events-out")
        self._spawn(self._read_loop(), "rtc-events-in")
        self._spawn(self._watchdog(), "rtc-liveness")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=f"{name}-{self.session_id}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("call %s: task %s failed", self.session_id, task.get_name(), exc_info=task.exception())

    # -- media in -------------------------------------------------------------------------------

    def alive(self) -> None:
        self.last_seen = time.monotonic()

    def _push_audio(self, audio: Audio) -> None:
        if self.state is not CallState.LIVE or self.session.closed:
            return
        self.session.last_activity = self.last_seen or time.monotonic()
        self.codec.push_audio(audio)

    def _store_video(self, frame: Frame) -> None:
        if self.state is CallState.LIVE and not self.session.closed:
            self.codec.push_video(frame)

    # -- events ---------------------------------------------------------------------------------

    def _send(self, text: str) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            self._pending.append(text)
            return
        if channel.bufferedAmount > CHANNEL_BUFFER_LIMIT:
            self.codec.end(1008, "client is not reading its data channel")
            return
        channel.send(text)

    def _flush_pending(self) -> None:
        while self._pending and self.channel is not None and self.channel.readyState == "open":
            self.channel.send(self._pending.popleft())

    async def _write_loop(self) -> None:
        while True:
            item = await self.codec.outbox.get()
            if isinstance(item, Close):
                await self._drain_channel()
                await self.finish(item.reason or "closed by the server")
                return
            self._send(item)

    async def _read_loop(self) -> None:
        while True:
            msg = await self._inbox.get()
            self._inbox_bytes -= len(msg)
            self.alive()
            try:
                # Transport keepalive, answered here: it is not part of either protocol's event codec.
                if isinstance(msg, str) and ('"duplex.ping"' in msg or '"duplex.pong"' in msg) and self._keepalive(msg):
                    continue
                await self.codec.handle_message(msg)
            except Exception as exc:  # a bug in handling one message must not leave the call deaf
                log.exception("call %s: handling a data-channel message failed", self.session.id)
                self.codec.report("internal_error", f"the server failed on that message ({type(exc).__name__}); "
                                  "the session continues")

    def _keepalive(self, msg: str) -> bool:
        """Answer the page's duplex.ping (its round-trip readout); a duplex.pong only proves life."""
        try:
            ev = p.loads_strict(msg)
        except (ValueError, RecursionError):  # not JSON, or nested too deeply: the codec will say so
            return False
        if not isinstance(ev, dict):
            return False
        if ev.get("type") == "duplex.ping":
            self._send(json.dumps({"type": "duplex.pong", "event_id": p.new_id("event"), "id": ev.get("id"),
                                   "t": ev.get("t")}))
            return True
        return ev.get("type") == "duplex.pong"

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(PING_INTERVAL)
            now = time.monotonic()
            if self.last_seen is None:
                if now - self.started > self.connect_timeout:
                    await self.finish(f"peer never connected within {self.connect_timeout:g} s")
                    return
            elif now - self.last_seen > LIVENESS_TIMEOUT:
                await self.finish(f"peer silent for {now - self.last_seen:.1f} s")
                return
            if self.codec.pings and self.channel is not None and self.channel.readyState == "open":
                ping = {"type": "duplex.ping", "event_id": p.new_id("event"), "t": time.time()}
                self._send(json.dumps(ping))

    async def _drain_channel(self) -> None:
        """Give queued events (duplex.session.closing) a moment to leave before the peer is closed."""
        deadline = time.monotonic() + FLUSH_TIMEOUT
        channel = self.channel
        while channel is not None and channel.readyState == "open" and time.monotonic() < deadline:
            if channel.bufferedAmount == 0:
                await asyncio.sleep(0.05)  # SCTP may still hold the last chunk unacknowledged
                return
            await asyncio.sleep(0.01)

    # -- teardown -------------------------------------------------------------------------------

    async def finish(self, why: str) -> None:
        """End the call: stop the tasks, close the peer, and let the runtime detach (or close) the session."""
        if self.state is CallState.ENDED:
            return
        was_live = self.state is CallState.LIVE
        self.state = CallState.ENDED
        log.info("call %s ended: %s; output %s", self.session_id or "-", why, asdict(self.track.pacer.stats))
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        self.track.stop()
        with contextlib.suppress(Exception):  # closing a half-broken peer may raise; it is closed anyway
            await self.pc.close()
        try:
            if was_live:
                await self._release()
        finally:
            self.codec.release()
            self._ended.set()
            if self._on_end is not None:
                self._on_end(self)

    async def _release(self) -> None:
        await self.runtime.detach(self.session, self.conn, self.codec.ended(self.last_seen is not None))

    async def wait_ended(self) -> None:
        await self._ended.wait()
