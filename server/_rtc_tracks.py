"""The media side of a WebRTC call: the paced output audio track and the input track readers.

aiortc decodes Opus and video in its own decoder thread and encodes in an executor; what runs here on
the event loop is cheap glue: 20 ms audio conversions, and handing video frames to a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import av
import numpy as np
from aiortc import MediaStreamTrack, RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.mediastreams import MediaStreamError

from server.limits import MAX_VIDEO_PIXELS
from streaming.avframes import FrameToMono, mono_to_frame
from streaming.pacer import AudioPacer
from streaming.pcm import Audio
from streaming.resample import StreamResampler
from streaming.types import SAMPLE_RATE, TICK_SECONDS
from streaming.video import Frame, downscale

log = logging.getLogger(__name__)

RTC_RATE = 48_000  # Opus always runs at 48 kHz; producing 48 kHz frames spares the encoder a resampler
FRAME_SAMPLES = 960  # 20 ms at 48 kHz: one Opus packet per frame
# A new camera frame is converted at most this often; the engine keeps only the newest one per
# micro-turn, so converting every frame of a 30 fps camera would be wasted work.
VIDEO_MIN_INTERVAL = TICK_SECONDS / 2


class AudioJitterBuffer(JitterBuffer):
    """Releases each audio packet as soon as it is the next in sequence.

    aiortc's audio buffer waits until 4 more frames have arrived (80 ms) and even with prefetch 1 it
    waits for the next packet (20 ms) to know that a frame is complete. An Opus frame is always one
    RTP packet, so the wait buys nothing here; a gap still holds later packets back until the missing
    one arrives or the ring overflows (then aiortc skips ahead), exactly as before.
    """

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        assert self._origin is not None
        packet = self._packets[self._origin % self._capacity]
        if packet is None:
            return None
        self.remove(1)
        return JitterFrame(data=packet._data, timestamp=packet.timestamp)  # type: ignore[attr-defined]


def use_low_latency_buffer(receiver: RTCRtpReceiver) -> bool:
    """Swap an audio receiver's jitter buffer for AudioJitterBuffer; call before any packet arrives.

    aiortc offers no setting for it, so this replaces a private attribute; if aiortc changes its
    internals the default buffer stays (and this returns False) rather than breaking the call.
    """
    attr = "_RTCRtpReceiver__jitter_buffer"
    current = getattr(receiver, attr, None)
    if type(current) is not JitterBuffer or not hasattr(current, "_packets"):
        return False
    setattr(receiver, attr, AudioJitterBuffer(capacity=current.capacity))
    return True


class PacedAudioTrack(MediaStreamTrack):
    """Outbound audio: the session's micro-turn outputs, released as 20 ms frames on an absolute schedule.

    Silence goes out whenever nothing is queued, so the browser's jitter buffer keeps running, and
    `clear` drops whatever is queued so that the stop is heard within a frame (barge-in, cancel).
    """

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.pacer = AudioPacer(RTC_RATE, FRAME_SAMPLES)
        self._upsample = StreamResampler(SAMPLE_RATE, RTC_RATE)

    def push(self, audio: Audio) -> None:
        """One micro-turn of output, float32 at 24 kHz."""
        self.pacer.push(self._upsample.process(audio))

    def clear(self) -> int:
        """Drop queued audio; returns the milliseconds dropped."""
        dropped = self.pacer.clear()
        # The resampler holds a few samples of filter delay: start afresh so none of them leaks out later.
        self._upsample = StreamResampler(SAMPLE_RATE, RTC_RATE)
        return round(dropped * 1000 / RTC_RATE)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        samples, index = await self.pacer.next_frame()
        return mono_to_frame(samples, RTC_RATE, index * FRAME_SAMPLES)


async def read_audio(track: MediaStreamTrack, push: Callable[[Audio], None],
                     alive: Callable[[], None]) -> None:
    """Remote audio -> mono float32 at 24 kHz -> `push`, until the track ends."""
    to_mono = FrameToMono(SAMPLE_RATE)
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        alive()
        assert isinstance(frame, av.AudioFrame), f"audio track produced {type(frame).__name__}"
        audio = to_mono.convert(frame)
        if len(audio):
            push(audio)


async def read_video(track: MediaStreamTrack, store: Callable[[Frame], None], alive: Callable[[], None],
                     convert: Callable[[av.VideoFrame], Awaitable[Frame]] | None = None) -> None:
    """Remote video -> the newest frame, downscaled, handed to `store`; frames in between are dropped.

    The track is drained continuously (aiortc queues decoded frames without bound). At most one
    conversion runs at a time, in a worker thread, and only every VIDEO_MIN_INTERVAL seconds.
    """
    loop = asyncio.get_running_loop()

    async def off_loop(frame: av.VideoFrame) -> Frame:
        return await loop.run_in_executor(None, downscale, frame)

    convert = convert or off_loop
    converting: asyncio.Future[Frame] | None = None
    last_start = -VIDEO_MIN_INTERVAL
    oversized = 0  # frames dropped for their size
    try:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            alive()
            assert isinstance(frame, av.VideoFrame), f"video track produced {type(frame).__name__}"
            if frame.width * frame.height > MAX_VIDEO_PIXELS:
                # A peer may send any resolution; converting huge frames would cost a core. Dropped, said once.
                if not oversized:
                    log.warning("dropping video frames of %dx%d (over %d pixels); send at most 3840x2160",
                                frame.width, frame.height, MAX_VIDEO_PIXELS)
                oversized += 1
                continue
            now = time.monotonic()
            if (converting is None or converting.done()) and now - last_start >= VIDEO_MIN_INTERVAL:
                converting = asyncio.ensure_future(convert(frame))
                converting.add_done_callback(lambda t: _store_result(t, store))
                last_start = now
    finally:
        if converting is not None and not converting.done():
            converting.cancel()


def _store_result(task: asyncio.Future[Frame], store: Callable[[Frame], None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.warning("dropping a video frame that could not be converted: %s", exc)
        return
    store(np.asarray(task.result()))
