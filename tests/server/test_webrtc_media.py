"""The media edge of a WebRTC call with real aiortc tracks: decoded audio -> 24 kHz, video -> newest small frame."""

from __future__ import annotations

import asyncio
import fractions
import json
import time

import av
import numpy as np
import pytest
from aiortc import MediaStreamTrack, VideoStreamTrack
from aiortc.mediastreams import MediaStreamError

from models.base import Event, TickOutput
from server._rtc_tracks import VIDEO_MIN_INTERVAL, PacedAudioTrack, read_audio, read_video
from server.config import ServerConfig
from server.realtime import RealtimeConnection
from server.runtime import Runtime
from streaming.avframes import FrameToMono, mono_to_frame
from streaming.video import MAX_SIDE, downscale, fit_size


class ToneTrack(MediaStreamTrack):
    """What aiortc's Opus decoder hands over: 20 ms s16 stereo frames at 48 kHz (here a 1 kHz tone)."""

    kind = "audio"

    def __init__(self, frames: int) -> None:
        super().__init__()
        self.left = frames
        self.n = 0

    async def recv(self) -> av.AudioFrame:
        if self.left == 0:
            self.stop()
            raise MediaStreamError
        self.left -= 1
        t = (self.n + np.arange(960)) / 48_000
        self.n += 960
        tone = (0.5 * 32767 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(np.repeat(tone, 2)[None, :], format="s16", layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = 48_000, self.n - 960, fractions.Fraction(1, 48_000)
        return frame


class ColourTrack(VideoStreamTrack):
    """A 30 fps 1280x720 camera whose red channel counts frames, so the newest one can be recognised."""

    def __init__(self, frames: int) -> None:
        super().__init__()
        self.left = frames
        self.count = 0

    async def recv(self) -> av.VideoFrame:
        if self.left == 0:
            self.stop()
            raise MediaStreamError
        self.left -= 1
        pts, time_base = await self.next_timestamp()
        self.count += 1
        rgb = np.zeros((720, 1280, 3), np.uint8)
        rgb[..., 0] = min(255, self.count * 4)
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
        frame.pts, frame.time_base = pts, time_base
        return frame


async def test_decoded_audio_becomes_24khz_mono() -> None:
    pushed: list[np.ndarray] = []
    alive: list[float] = []
    await read_audio(ToneTrack(frames=25), pushed.append, lambda: alive.append(time.monotonic()))
    audio = np.concatenate(pushed)
    assert len(alive) == 25
    assert abs(len(audio) - 25 * 480) <= 64, "0.5 s at 48 kHz must become 0.5 s at 24 kHz"
    spectrum = np.abs(np.fft.rfft(audio[2000:10000]))
    assert abs(np.argmax(spectrum) * 24_000 / 8000 - 1000) <= 3, "the tone keeps its pitch"
    assert 0.45 < np.abs(audio[2000:]).max() < 0.55, "stereo is averaged to mono, not summed"


async def test_video_keeps_only_the_newest_small_frame() -> None:
    stored: list[np.ndarray] = []
    track = ColourTrack(frames=30)  # one second at 30 fps
    await read_video(track, stored.append, lambda: None)
    await asyncio.sleep(0.2)  # the last conversion may still be finishing in its worker thread
    assert 1 / VIDEO_MIN_INTERVAL / 2 <= len(stored) <= 1 / VIDEO_MIN_INTERVAL + 2, (
        f"{len(stored)} of 30 frames converted: frames arriving faster must be dropped, not queued")
    assert all(f.shape == (180, 320, 3) and f.dtype == np.uint8 for f in stored)
    reds = [int(f[..., 0].mean()) for f in stored]
    # The last one stored is recent: at most the throttle interval (3 frames) plus scheduling slack behind.
    assert reds == sorted(reds) and reds[-1] >= 4 * 24, f"frames must be the newest ones, in order: {reds}"


class HugeTrack(VideoStreamTrack):
    """A peer sending frames far over the size cap."""

    def __init__(self, frames: int) -> None:
        super().__init__()
        self.left = frames

    async def recv(self) -> av.VideoFrame:
        if self.left == 0:
            raise MediaStreamError
        self.left -= 1
        pts, time_base = await self.next_timestamp()
        frame = av.VideoFrame(4096, 2304, "yuv420p")
        frame.pts, frame.time_base = pts, time_base
        return frame


async def test_video_frames_over_the_size_cap_are_dropped_unconverted() -> None:
    stored: list[np.ndarray] = []
    seen: list[int] = []
    await read_video(HugeTrack(frames=4), stored.append, lambda: seen.append(1))
    await asyncio.sleep(0.1)
    assert len(seen) == 4 and stored == [], "oversized frames count as life but are never converted"


def test_downscale_keeps_aspect_and_colour() -> None:
    assert fit_size(1280, 720) == (320, 180)
    assert fit_size(480, 640) == (240, 320)
    assert fit_size(100, 60) == (100, 60), "small frames are not enlarged"
    rgb = np.zeros((480, 640, 3), np.uint8)
    rgb[..., 2] = 200
    small = downscale(av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p"))
    assert small.shape == (240, MAX_SIDE, 3)
    assert abs(int(small[..., 2].mean()) - 200) < 12 and small[..., 0].mean() < 20
    with pytest.raises(ValueError, match="positive"):
        fit_size(0, 10)


async def test_output_track_paces_audio_and_clears_at_once() -> None:
    track = PacedAudioTrack()
    track.push(np.full(4800, 0.5, np.float32))  # one micro-turn at 24 kHz
    frames = [await track.recv() for _ in range(3)]
    assert all(f.sample_rate == 48_000 and f.samples == 960 and f.format.name == "s16" for f in frames)
    assert [f.pts for f in frames] == [0, 960, 1920], "pts is a continuous 48 kHz sample clock"
    assert np.abs(frames[1].to_ndarray()).max() > 10_000, "queued speech is sent"
    assert track.clear() > 100, "about 140 ms were still queued"
    assert not (await track.recv()).to_ndarray().any(), "after clear the very next frame is silent"
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()


def test_frame_conversions_round_trip() -> None:
    audio = np.linspace(-0.5, 0.5, 960, dtype=np.float32)
    frame = mono_to_frame(audio, 48_000, pts=960)
    assert frame.pts == 960 and frame.samples == 960
    back = FrameToMono(48_000).convert(frame)
    assert np.allclose(back, audio, atol=1 / 32768)


async def test_the_model_yielding_drops_queued_speech_at_once() -> None:
    """Barge-in: the model gives up the floor; what it had queued for the speaker must not play on."""
    track = PacedAudioTrack()
    runtime = await Runtime.create(ServerConfig(model="echo", max_sessions=2, phase_groups=1, background="none"))
    try:
        conn = RealtimeConnection(runtime, audio_out=track, media_ok=False)  # as a WebRTC call composes it
        await runtime.attach(conn)
        conn.deliver(TickOutput(np.full(4800, 0.3, np.float32), text="I was saying"), tick=0)
        conn.deliver(TickOutput(np.full(4800, 0.3, np.float32)), tick=1)
        assert track.pacer.queued > 18_000, "two micro-turns of speech are queued (48 kHz)"
        conn.deliver(TickOutput(np.zeros(4800, np.float32), events=[Event("yielded")]), tick=2)
        assert track.pacer.queued == 0
        events = []
        while len(conn.outbox):
            item = conn.outbox.get_nowait()
            if isinstance(item, str):
                events.append(json.loads(item))
        assert [e["type"] for e in events][-1] == "response.done", "the response ends too"
    finally:
        await runtime.stop()
