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
MAX_OFFER_MLINES = 4  # m= sections in an offer: audio, video, data channel (+1 spare)
MAX_VIDEO_PIXELS = 3840 * 2160  # larger decoded frames are dropped (counted) before conversion
