"""What aiortc holds for a WebRTC peer before duplex's own checks see it, bounded.

aiortc's SCTP (the data channel's transport) keeps every DATA chunk of a message until the message is
whole, and checks neither the size of a message against the `max-message-size` it advertised nor the
bytes held against the receive window it advertised: a peer that ignores both (a hostile one only:
aiortc and browsers honour the advertised size) sent one endless message and the server held all of it.
So each call's SCTP transport is watched per DATA chunk: held bytes beyond the window it advertised,
or more chunks than a window of full chunks, and the call is ended (`on_exceeded`), which frees them.
The figures are aiortc's own (the window, its largest chunk) so that no legal peer can reach them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiortc import RTCPeerConnection, rtcrtpreceiver

log = logging.getLogger(__name__)

# Chunks held at once for a peer that fills the window with the smallest chunks it could send: a legal
# one sends full chunks (USERDATA_MAX_LENGTH, ~1.2 kB), so a window of them is under a thousand.
MAX_HELD_CHUNKS = 4096


def held(sctp: Any) -> tuple[int, int]:
    """Bytes and chunks aiortc holds for reassembly on `sctp` (an RTCSctpTransport), all streams."""
    chunks = [c for stream in sctp._inbound_streams.values() for c in stream.reassembly]
    return sum(len(c.user_data) for c in chunks), len(chunks)


def bound_sctp(pc: RTCPeerConnection, on_exceeded: Callable[[str], None]) -> bool:
    """Watch `pc`'s SCTP transport (after the offer is applied); False when the offer has no data channel.

    aiortc keeps `_advertised_rwnd` as the window less what it holds, so the check per chunk is a
    subtraction; the chunk count is only taken once the bytes are past a tenth of the window. Once
    tripped, further chunks are dropped unread while `on_exceeded` (which must not block: it runs inside
    aiortc's receive path) ends the call.
    """
    sctp = pc.sctp
    if sctp is None:
        return False
    window = int(sctp._advertised_rwnd)  # nothing is held yet: the whole window
    receive = sctp._receive_data_chunk
    tripped = False

    async def bounded_receive(chunk: Any) -> None:
        nonlocal tripped
        if tripped:
            return
        await receive(chunk)
        held_bytes = window - sctp._advertised_rwnd
        over = held_bytes > window
        if not over and held_bytes > window // 10:
            over = held(sctp)[1] > MAX_HELD_CHUNKS
        if over:
            tripped = True
            n_bytes, n_chunks = held(sctp)
            why = (f"data channel flood: {n_bytes} bytes in {n_chunks} chunks held for reassembly, past the "
                   f"{window}-byte window the server advertised")
            log.warning("%s; ending the call", why)
            on_exceeded(why)

    sctp._receive_data_chunk = bounded_receive  # type: ignore[method-assign]  # aiortc has no hook for it
    return True


# Decoded video: aiortc decodes each frame at the size its bitstream declares (VP8 up to 16383x16383,
# ~400 MB a frame) on the call's decoder thread, before server/_rtc_tracks.py sees a pixel. A camera
# larger than 4K is refused before decoding; perception scales every picture far below it anyway.
MAX_VIDEO_PIXELS = 3840 * 2160
_aiortc_get_decoder = rtcrtpreceiver.get_decoder
_VP8_START_CODE = b"\x9d\x01\x2a"


def vp8_keyframe_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) a VP8 key frame declares (RFC 6386, 9.1), or None for an inter frame."""
    if len(data) < 10 or data[0] & 1 or data[3:6] != _VP8_START_CODE:
        return None
    return int.from_bytes(data[6:8], "little") & 0x3FFF, int.from_bytes(data[8:10], "little") & 0x3FFF


class _BoundedVp8:
    """aiortc's VP8 decoder behind a look at each key frame's declared size: a frame too large is dropped
    undecoded, and so is every frame after it until a key frame of an allowed size (they depend on it)."""

    def __init__(self, decoder: Any) -> None:
        self._decoder = decoder
        self._refused: tuple[int, int] | None = None

    def decode(self, encoded_frame: Any) -> list[Any]:
        size = vp8_keyframe_size(encoded_frame.data)
        if size is not None:
            refused = size if size[0] * size[1] > MAX_VIDEO_PIXELS else None
            if refused is not None and self._refused is None:
                log.warning("video: a %dx%d VP8 frame (over %d pixels) dropped undecoded, and what follows it",
                            *refused, MAX_VIDEO_PIXELS)
            self._refused = refused
        if self._refused is not None:
            return []
        return list(self._decoder.decode(encoded_frame))


def _bounded_decoder(codec: Any) -> Any:
    decoder: Any = _aiortc_get_decoder(codec)  # aiortc types it as its Decoder base, without `codec`
    if codec.mimeType.lower().startswith("video/"):
        # FFmpeg checks a picture's size against max_pixels before it allocates the picture: an H.264 frame
        # over it fails to decode (aiortc logs it and asks for a key frame). Set before the first decode
        # opens the context. libvpx decodes into buffers of its own first, so VP8 is also checked above.
        context = decoder.codec  # aiortc's decoders keep their PyAV codec context here
        context.options = {**context.options, "max_pixels": str(MAX_VIDEO_PIXELS)}
    if codec.mimeType.lower() == "video/vp8":
        return _BoundedVp8(decoder)
    return decoder


def bound_video_decoding() -> None:
    """Put the size checks in front of aiortc's video decoders, for every call (idempotent)."""
    if rtcrtpreceiver.get_decoder is not _bounded_decoder:
        rtcrtpreceiver.get_decoder = _bounded_decoder

