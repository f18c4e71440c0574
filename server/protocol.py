"""The event codec shared by the WebSocket endpoint and the WebRTC data channel.

A compatible subset of the OpenAI Realtime API (GA names, beta names accepted where free); our own
extensions use the `duplex.` prefix. Nothing here touches sockets or the engine.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
from dataclasses import dataclass
from typing import Any

EXT = "duplex."  # prefix of every extension event

# Client event types we understand (beta aliases map to the same handlers).
CLIENT_EVENTS = frozenset({
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.retrieve",
    "conversation.item.delete",
    "conversation.item.truncate",
    "response.create",
    "response.cancel",
    "output_audio_buffer.clear",
    "duplex.background.request",
    "duplex.input_video.append",
})

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):012x}"


class ProtocolError(Exception):
    """A client message we cannot act on; becomes an `error` event, the session continues."""

    def __init__(self, code: str, message: str, param: str | None = None, event_id: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id


def error_event(code: str, message: str, param: str | None = None, client_event_id: str | None = None,
                kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "event_id": new_id("event"),
            "error": {"type": kind, "code": code, "message": message, "param": param,
                      "event_id": client_event_id}}


def _refuse_constant(name: str) -> Any:
    # json.loads takes NaN, Infinity and -Infinity by default; they are not JSON (RFC 8259), and whatever
    # holds them (a tool schema) would be echoed back as text a browser's JSON.parse rejects.
    raise ValueError(f"{name} is not a JSON value")


def loads_strict(text: str | bytes) -> Any:
    """json.loads that refuses the NaN / Infinity literals Python accepts by default (ValueError)."""
    return json.loads(text, parse_constant=_refuse_constant)


def parse_client_text(text: str) -> dict[str, Any]:
    """JSON text -> event dict with a known `type`, or ProtocolError naming what is wrong."""
    try:
        event = loads_strict(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError("invalid_json", f"message is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:  # "[" * 100000 is under the size limit but deeper than the parser goes
        raise ProtocolError("invalid_json", "message is nested too deeply to be an event; send a flat JSON "
                            "object with a 'type' field") from None
    except ValueError as exc:  # not a JSONDecodeError: an integer longer than Python converts (4300 digits)
        if "is not a JSON value" in str(exc):
            raise ProtocolError("invalid_json", f"message is not valid JSON: {exc}; NaN and Infinity have no "
                                "JSON spelling (send null or a number)") from None
        raise ProtocolError("invalid_json", f"message has a number the server cannot read ({str(exc)[:80]}); "
                            "send numbers of ordinary size") from None
    if not isinstance(event, dict):
        raise ProtocolError("invalid_event", "an event must be a JSON object with a 'type' field")
    etype = event.get("type")
    eid = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    if not isinstance(etype, str):
        raise ProtocolError("missing_type", "event has no string 'type' field", "type", eid)
    if etype not in CLIENT_EVENTS:
        raise ProtocolError("unknown_event_type", f"unknown event type {etype!r}; supported: "
                            + ", ".join(sorted(CLIENT_EVENTS)), "type", eid)
    return event


def decode_audio_b64(value: Any, event_id: str | None) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError("invalid_audio", "'audio' must be a base64 string of PCM16 samples", "audio", event_id)
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_base64", "'audio' is not valid base64", "audio", event_id) from None
    if len(data) % 2:
        raise ProtocolError("odd_pcm_length", f"decoded audio has {len(data)} bytes; PCM16 needs an even number",
                            "audio", event_id)
    return data


def encode_audio_b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode("ascii")


@dataclass
class AudioFormat:
    rate: int = 24000

    def describe(self) -> dict[str, Any]:
        return {"type": "audio/pcm", "rate": self.rate}


SUPPORTED_RATES = (8000, 16000, 24000, 48000)


def parse_format(value: Any, param: str, event_id: str | None) -> AudioFormat:
    """Accept GA `{"type": "audio/pcm", "rate": R}` and beta `"pcm16"` (24 kHz)."""
    if value == "pcm16":
        return AudioFormat(24000)
    if isinstance(value, dict) and value.get("type", "audio/pcm") in ("audio/pcm", "pcm16"):
        rate = value.get("rate", 24000)
        if rate not in SUPPORTED_RATES:
            raise ProtocolError("unsupported_rate", f"{param}.rate {rate!r} is not supported; use one of "
                                f"{list(SUPPORTED_RATES)}", param, event_id)
        return AudioFormat(int(rate))
    raise ProtocolError("unsupported_format", f"{param} {value!r} is not supported; use "
                        "{'type': 'audio/pcm', 'rate': 24000} (or beta 'pcm16')", param, event_id)


def item_text(item: Any, event_id: str | None) -> str:
    """Text of a user `message` item (`input_text` / `text` parts)."""
    text, _, parts = _item_parts(item, event_id)
    if not parts:
        raise ProtocolError("invalid_item", "message content needs 'input_text' parts with a 'text' string",
                            "item.content", event_id)
    return text


IMAGE_TYPES = ("image/jpeg", "image/png")


def item_parts(item: Any, event_id: str | None) -> tuple[str, list[tuple[str, bytes]]]:
    """A user `message` item -> (its text, its pictures as (MIME type, bytes)); at least one part of them.

    Text parts are `input_text` (or `text`); a picture is an `input_image` part whose `image_url` is a
    `data:image/jpeg;base64,...` or `data:image/png;base64,...` URL, as OpenAI Realtime sends them.
    """
    text, images, _ = _item_parts(item, event_id)
    return text, images


def _item_parts(item: Any, event_id: str | None) -> tuple[str, list[tuple[str, bytes]], int]:
    """(text, pictures, number of text parts); ProtocolError unless there is a text part or a picture."""
    if not isinstance(item, dict):
        raise ProtocolError("invalid_item", "'item' must be an object", "item", event_id)
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise ProtocolError("invalid_item", "message item needs a non-empty 'content' list", "item.content",
                            event_id)
    texts: list[str] = []
    images: list[tuple[str, bytes]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise ProtocolError("invalid_item", f"content[{i}] needs a 'text' string", "item.content", event_id)
            texts.append(text)
        elif kind == "input_image":
            images.append(decode_data_url(part.get("image_url"), f"item.content[{i}].image_url", event_id))
        # other parts (input_audio, ...) are ignored, as they were before pictures were read
    if not texts and not images:
        raise ProtocolError("invalid_item", "message content needs 'input_text' parts with a 'text' string or "
                            "'input_image' parts", "item.content", event_id)
    return " ".join(t for t in texts if t), images, len(texts)


def decode_data_url(value: Any, param: str, event_id: str | None) -> tuple[str, bytes]:
    """`data:image/jpeg;base64,...` -> ("image/jpeg", bytes). Only the type it names is checked here."""
    if not isinstance(value, str) or not value.startswith("data:"):
        raise ProtocolError("invalid_image_url", f"{param} must be a data URL (data:image/jpeg;base64,... or "
                            "data:image/png;base64,...); the server fetches no remote pictures", param, event_id)
    head, sep, body = value[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        raise ProtocolError("invalid_image_url", f"{param} must be a base64 data URL (data:TYPE;base64,DATA)",
                            param, event_id)
    mime = head[: -len(";base64")].lower()
    if mime not in IMAGE_TYPES:
        raise ProtocolError("unsupported_image_type", f"{param} is {mime[:40]!r}; send image/jpeg or image/png",
                            param, event_id)
    return mime, decode_b64(body, param, event_id)


def decode_b64(value: Any, param: str, event_id: str | None) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError("invalid_base64", f"{param} must be a base64 string", param, event_id)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_base64", f"{param} is not valid base64", param, event_id) from None
