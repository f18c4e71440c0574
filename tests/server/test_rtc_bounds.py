"""What aiortc decodes for a WebRTC peer, bounded before it decodes (server/rtc_bounds.py): real frames
from aiortc's own VP8 encoder and from libx264, through the decoders aiortc would use for a call."""

from __future__ import annotations

import fractions

import av
import pytest
from aiortc import rtcrtpreceiver
from aiortc.codecs import depayload
from aiortc.codecs.vpx import Vp8Encoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from server.rtc_bounds import MAX_VIDEO_PIXELS, _bounded_decoder, bound_video_decoding, vp8_keyframe_size

VP8 = RTCRtpCodecParameters(mimeType="video/VP8", clockRate=90000, payloadType=96)
H264 = RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000, payloadType=102)
HUGE = (4096, 2304)  # a 4K-and-more camera: 9.4 million pixels


def _black(width: int, height: int, pts: int = 0) -> av.VideoFrame:
    frame = av.VideoFrame(width, height, "yuv420p")
    for plane in frame.planes:
        plane.update(bytes(plane.buffer_size))
    frame.pts, frame.time_base = pts, fractions.Fraction(1, 90000)
    return frame


def _vp8_frames(width: int, height: int, n: int = 2) -> list[JitterFrame]:
    """A key frame then inter frames, as a call's jitter buffer hands them to the decoder."""
    encoder = Vp8Encoder()
    frames = []
    for i in range(n):
        payloads, timestamp = encoder.encode(_black(width, height, i * 3000), force_keyframe=i == 0)
        frames.append(JitterFrame(data=b"".join(depayload(VP8, p) for p in payloads), timestamp=timestamp))
    return frames


def test_a_vp8_key_frame_over_the_cap_is_dropped_undecoded_with_what_follows_until_an_allowed_one() -> None:
    assert HUGE[0] * HUGE[1] > MAX_VIDEO_PIXELS
    decoder = _bounded_decoder(VP8)
    small = _vp8_frames(320, 240)
    assert vp8_keyframe_size(small[0].data) == (320, 240) and vp8_keyframe_size(small[1].data) is None
    assert [(f.width, f.height) for f in decoder.decode(small[0])] == [(320, 240)]
    huge = _vp8_frames(*HUGE)
    assert vp8_keyframe_size(huge[0].data) == HUGE
    assert decoder.decode(huge[0]) == [] and decoder.decode(huge[1]) == []  # the inter frame needs the key
    again = _vp8_frames(320, 240)
    assert [(f.width, f.height) for f in decoder.decode(again[0])] == [(320, 240)]


def test_an_h264_frame_over_the_cap_fails_to_decode_and_a_small_one_decodes() -> None:
    def encoded(width: int, height: int) -> JitterFrame:
        encoder = av.CodecContext.create("libx264", "w")
        encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
        encoder.time_base = fractions.Fraction(1, 90000)
        encoder.options = {"preset": "ultrafast", "tune": "zerolatency"}
        packets = encoder.encode(_black(width, height)) + encoder.encode(None)
        return JitterFrame(data=b"".join(bytes(p) for p in packets), timestamp=0)

    with pytest.raises(av.FFmpegError):  # aiortc's decoder thread logs it and asks for a key frame
        _bounded_decoder(H264).decode(encoded(*HUGE))
    assert [(f.width, f.height) for f in _bounded_decoder(H264).decode(encoded(320, 240))] == [(320, 240)]


def test_every_call_gets_the_bounded_decoders() -> None:
    bound_video_decoding()
    bound_video_decoding()  # idempotent
    assert rtcrtpreceiver.get_decoder is _bounded_decoder
    assert type(rtcrtpreceiver.get_decoder(VP8)).__name__ == "_BoundedVp8"
