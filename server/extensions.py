"""duplex's extensions to the Realtime protocol, sent only to a client that asked for them.

A client that did not ask gets the OpenAI Realtime protocol and nothing else: strict clients (agent
frameworks that parse every server event against the API's types) report an unknown event or field as
an error. A client asks once per connection, with the header `X-Duplex-Extensions: 1` or (browsers'
WebSockets, which cannot set headers) the subprotocol `duplex-extensions`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

HEADER = "x-duplex-extensions"
SUBPROTOCOL = "duplex-extensions"

# Fields of OpenAI events that duplex adds for its own clients, per event type ("*": every type).
_EXTRA_FIELDS: dict[str, tuple[str, ...]] = {
    "*": ("tick",),
    "output_audio_buffer.cleared": ("dropped_ms",),
}
_EXTRA_SESSION_FIELDS = ("pace", "duplex")


def wants_extensions(headers: Mapping[str, str], offered: Iterable[str] = ()) -> bool:
    """Whether a connection asked for duplex's extensions (header or subprotocol)."""
    value = headers.get(HEADER, "").strip().lower()
    return value in ("1", "true", "yes", "on") or SUBPROTOCOL in offered


def is_extension(event: dict[str, Any]) -> bool:
    return str(event.get("type", "")).startswith("duplex.")


def plain(event: dict[str, Any]) -> dict[str, Any] | None:
    """The event as a client without extensions gets it: None for a duplex event, else without our fields."""
    if is_extension(event):
        return None
    etype = event.get("type", "")
    extra = _EXTRA_FIELDS["*"] + _EXTRA_FIELDS.get(etype, ())
    if not any(k in event for k in extra) and not isinstance(event.get("session"), dict):
        return event
    out = {k: v for k, v in event.items() if k not in extra}
    if isinstance(out.get("session"), dict):
        out["session"] = {k: v for k, v in out["session"].items() if k not in _EXTRA_SESSION_FIELDS}
    return out
