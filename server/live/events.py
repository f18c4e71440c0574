"""GPT-Live client events and the protocol's error shape; nothing here touches sockets or sessions."""

from __future__ import annotations

import json
from typing import Any

from server import protocol as p

# Client events served on the WebSocket, and those the protocol has that duplex refuses by name.
CLIENT_EVENTS = frozenset({
    "session.start",
    "session.update",
    "session.close",
    "session.input_audio.append",
    "session.input_audio.mute",
    "session.input_audio.unmute",
    "session.instructions.append",
    "session.thinking.append",
    "session.commentary.append",
    "response.item.create",
    "response.create",
})
# duplex's own client events, served only to a connection that asked for extensions (server/extensions.py).
EXTENSION_EVENTS = frozenset({"duplex.input_video.append"})
UNSUPPORTED_EVENTS = {
    "session.output_audio.fixture.play": "output fixtures are not supported by duplex",
    "decision.create": "Decisions are not supported by duplex",
    "decision.item.create": "Decisions are not supported by duplex",
    "decision.item.delete": "Decisions are not supported by duplex",
}


class LiveError(Exception):
    """A client command duplex cannot act on: one `error` event; the session (if any) goes on."""

    def __init__(self, code: str, message: str, param: str | None = None, client_event_id: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.client_event_id, self.kind = (
            code, message, param, client_event_id, kind)

    def event(self) -> dict[str, Any]:
        return error_event(self.code, self.message, self.param, self.client_event_id, self.kind)


def error_event(code: str, message: str, param: str | None = None, client_event_id: str | None = None,
                kind: str = "invalid_request_error") -> dict[str, Any]:
    """The protocol's `error`: the client event's id goes in `client_event_id` (Realtime says `event_id`)."""
    return {"type": "error", "event_id": p.new_id("event"),
            "error": {"type": kind, "code": code, "message": message, "param": param,
                      "client_event_id": client_event_id}}


def parse(text: str, extensions: bool = False) -> dict[str, Any]:
    """A JSON text frame -> an event with a served `type`, or LiveError naming what is wrong.
    `extensions`: the connection asked for duplex's extensions (EXTENSION_EVENTS are served)."""
    try:
        event = p.loads_strict(text)
    except (ValueError, RecursionError):
        raise LiveError("invalid_json", "the message is not a JSON object; send one event per text frame") from None
    if not isinstance(event, dict):
        raise LiveError("invalid_json", "an event must be a JSON object with a 'type' field")
    eid = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    etype = event.get("type")
    if not isinstance(etype, str):
        raise LiveError("missing_required_parameter", "the event has no string 'type'", "type", eid)
    if etype in UNSUPPORTED_EVENTS:
        raise LiveError("unsupported_event", f"{etype}: {UNSUPPORTED_EVENTS[etype]}", "type", eid)
    if etype in EXTENSION_EVENTS:
        if extensions:
            return event
        raise LiveError("unknown_event", f"{etype} is a duplex extension: connect with the header "
                        "'X-Duplex-Extensions: 1' (or the subprotocol 'duplex-extensions') to use it", "type", eid)
    if etype not in CLIENT_EVENTS:
        raise LiveError("unknown_event", f"unknown event type {etype[:64]!r}; supported client events: "
                        + ", ".join(sorted(CLIENT_EVENTS)), "type", eid)
    return event


def dumps(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


def check_fields(event: dict[str, Any], allowed: set[str], eid: str | None) -> None:
    """The protocol is strict: a field it does not define is refused by name."""
    for key in event:
        if key not in allowed and key not in ("type", "event_id"):
            raise LiveError("unknown_parameter", f"unknown parameter {key[:64]!r} in {event['type']}", key[:64], eid)
