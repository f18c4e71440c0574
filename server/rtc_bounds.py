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

from aiortc import RTCPeerConnection

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
