"""Bounds on everything a client can make the server hold, in one place.

Every queue or field a client can fill is bounded (in bytes or characters, not only in count), and
every bound that is hit says so: an `error` event naming it, or a counted drop. The numbers are
generous for real clients and small enough that one misbehaving client cannot pin much memory.
"""

from __future__ import annotations

MAX_INSTRUCTIONS_CHARS = 32_000  # session.instructions
MAX_TOOLS = 64  # session.tools entries
MAX_TOOLS_JSON_BYTES = 64 * 1024  # session.tools, serialized
MAX_ITEM_TEXT_CHARS = 16_000  # one conversation.item.create message
MAX_PENDING_TEXT_CHARS = 64_000  # typed text waiting for the next micro-turn
MAX_FUNCTION_OUTPUT_CHARS = 64_000  # one function_call_output item
DEFAULT_OUTBOX_BYTES = 8 << 20  # serialized events queued for one client before it is disconnected
BACKLOG_BYTES = 4 << 20  # outputs and events kept for a detached session, replayed on resume
BACKLOG_ITEMS = 2000  # and at most this many of them
RTC_INBOX_BYTES = 2 << 20  # data-channel messages waiting to be handled
MAX_OFFER_BYTES = 64 * 1024  # an SDP offer; real ones are a few kB
DRAIN_BYTES = 1 << 20  # a request body up to this is read before its answer (server/unread_body.py)
MAX_OFFER_MLINES = 4  # m= sections in an offer: audio, video, data channel (+1 spare)
MAX_VIDEO_PIXELS = 3840 * 2160  # larger decoded frames are dropped (counted) before conversion
# Pictures sent as JSON (an `input_image` part, a `duplex.input_video.append` frame) must also fit in the
# message limit (--max-frame-bytes, 256 kB by default: a 640x480 JPEG is 30-100 kB).
MAX_IMAGE_BYTES = 4 << 20  # one decoded JPEG / PNG file
MAX_IMAGE_PIXELS = 4096 * 4096  # the size its header declares; checked before any pixel is decoded
MAX_IMAGES_PER_ITEM = 1  # input_image parts in one item: a micro-turn sees one picture (the newest)
IMAGE_MAX_SIDE = 640  # pictures are shrunk to this longest side at once: what perception works at
# A WebSocket camera: at most this many frames a second on average, with a burst of VIDEO_FRAME_BURST so
# network jitter on a steady 5 fps stream is not refused. Frames beyond it are dropped with an error.
VIDEO_FRAMES_PER_S = 5.0
VIDEO_FRAME_BURST = 3
# input_image pictures in conversation items: the same average, a larger burst (an app may send a few
# pictures at once), so decoding cannot be used to keep a core busy.
IMAGE_ITEM_BURST = 8
# A TCP connection whose sent data stays unacknowledged this long (a peer that vanished, or one that
# never reads: its zero window is probed forever) is dropped by the kernel. Without it a client that
# never reads and never closes pins a socket, its send buffer and our transport buffer for good, after
# its session was cut and reaped. A real-time client stalled this long is gone; its session stays
# resumable for the grace period.
TCP_USER_TIMEOUT_S = 30
# Unsent output the kernel may hold for a connection (TCP_NOTSENT_LOWAT; data in flight does not count,
# so a reading client's throughput is not bounded by it). Without it Linux grows a connection's send
# buffer to megabytes (tcp_wmem: 4 MB) and takes that much output of a client that stops reading before
# our writer ever waits, so the outbox (--max-outbox-bytes) only filled if the server out-ran the client's
# own sends; when those stalled first (its full receive window also loses the ACKs they wait for), the
# client was never cut and its session was held until idle. With it, unread output backs up into the
# outbox after ~128 kB (plus the transport's 64 kB) and the client is cut.
TCP_NOTSENT_LOWAT_BYTES = 128 * 1024
# Seconds between the reaper's full garbage collections (the default of --collect-every). A finished
# connection (uvicorn's protocol, websockets' zlib contexts, our connection and session) sits in
# reference cycles that only a full collection frees, and CPython starts one by itself only after about
# 70,000 net container allocations (thresholds 700, 10, 10; none ran in 24 sessions,
# tests/server/test_memory.py), so the garbage of many connections piled up in the heap, whose
# high-water mark then only rose (bench.reliability.soak: RSS grew by steps, ~3.4-4.5 MB per 10 min with 8-12
# sessions). Start-up objects are frozen (server/app.py), so a collection scans only what the live
# sessions hold (1 ms with 4 sessions).
COLLECT_EVERY = 10.0
