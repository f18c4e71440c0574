"""`session.update`: validate a client's settings against the session's and return the new ones.

Everything is checked before anything changes, so a bad field changes nothing. Sizes are bounded
(server/limits.py): the settings are echoed in session.updated and kept for the session's life.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from server import protocol as p
from server.limits import MAX_INSTRUCTIONS_CHARS, MAX_TOOLS, MAX_TOOLS_JSON_BYTES
from server.protocol import ProtocolError
from server.sessions import Pace, SessionSettings


def updated_settings(cfg: Any, current: SessionSettings, audio_started: bool, media_ok: bool,
                     eid: str | None) -> SessionSettings:
    """The settings after applying `cfg` (the event's `session` object); ProtocolError if any field is bad."""
    if not isinstance(cfg, dict):
        raise ProtocolError("invalid_session", "'session' must be an object", "session", eid)
    pace = current.pace
    if "pace" in cfg:
        try:
            pace = Pace(cfg["pace"])
        except ValueError:
            raise ProtocolError("invalid_pace", f"session.pace must be 'realtime' or 'media', got {cfg['pace']!r}",
                                "session.pace", eid) from None
        if pace is Pace.MEDIA and not media_ok:
            raise ProtocolError("pace_unsupported", "a WebRTC call always runs in real time; use the WebSocket "
                                "endpoint /v1/realtime for pace 'media'", "session.pace", eid)
        if pace is not current.pace and audio_started:
            raise ProtocolError("pace_locked", "session.pace can only change before the first audio is sent",
                                "session.pace", eid)
    audio: dict[str, Any] = cfg["audio"] if isinstance(cfg.get("audio"), dict) else {}
    in_fmt, out_fmt = current.in_format, current.out_format
    if "input_audio_format" in cfg:
        in_fmt = p.parse_format(cfg["input_audio_format"], "session.input_audio_format", eid)
    if isinstance(audio.get("input"), dict) and "format" in audio["input"]:
        in_fmt = p.parse_format(audio["input"]["format"], "session.audio.input.format", eid)
    if "output_audio_format" in cfg:
        out_fmt = p.parse_format(cfg["output_audio_format"], "session.output_audio_format", eid)
    if isinstance(audio.get("output"), dict) and "format" in audio["output"]:
        out_fmt = p.parse_format(audio["output"]["format"], "session.audio.output.format", eid)
    if in_fmt.rate != current.in_format.rate and audio_started:
        raise ProtocolError("format_locked", "the input format can only change before the first audio",
                            "session.audio.input.format", eid)
    instructions = checked_instructions(cfg.get("instructions", current.instructions), "session", eid)
    tools = checked_tools(cfg.get("tools", current.tools), "session", eid)
    ext = cfg.get("duplex", {})
    if not isinstance(ext, dict):
        raise ProtocolError("invalid_session", "session.duplex must be an object", "session.duplex", eid)
    tick_stats = bool(ext["tick_stats"]) if "tick_stats" in ext else current.tick_stats
    media_clock = _media_clock(ext, current, pace, audio_started, eid)
    return dataclasses.replace(current, pace=pace, in_format=in_fmt, out_format=out_fmt, instructions=instructions,
                               tools=tools,
                               tool_choice=checked_tool_choice(cfg.get("tool_choice", current.tool_choice), tools,
                                                               "session", eid),
                               output_modality=checked_output_modality(cfg, "session", eid) or current.output_modality,
                               tick_stats=tick_stats,
                               media_clock=media_clock)


# The checks below are shared by `session.update` and `response.create`'s `response` object (server/
# response_config.py): `prefix` ("session" or "response") names the object in the error's param and message.


def checked_instructions(value: Any, prefix: str, eid: str | None) -> str:
    """`instructions`: a string within MAX_INSTRUCTIONS_CHARS."""
    param = f"{prefix}.instructions"
    if not isinstance(value, str):
        raise ProtocolError("invalid_instructions", f"{param} must be a string", param, eid)
    if len(value) > MAX_INSTRUCTIONS_CHARS:
        raise ProtocolError("instructions_too_long", f"{param} has {len(value)} characters; the limit is "
                            f"{MAX_INSTRUCTIONS_CHARS}", param, eid)
    return value


def checked_tools(value: Any, prefix: str, eid: str | None) -> list[dict[str, Any]]:
    """`tools`: a list of named function tools, bounded in count and in JSON size."""
    param = f"{prefix}.tools"
    if not isinstance(value, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                              for t in value):
        raise ProtocolError("invalid_tools", f"{param} must be a list of {{type: 'function', name, "
                            "description, parameters}", param, eid)
    if len(value) > MAX_TOOLS:
        raise ProtocolError("too_many_tools", f"{param} has {len(value)} tools; the limit is {MAX_TOOLS}",
                            param, eid)
    try:
        size = len(json.dumps(value, separators=(",", ":")))
    except (RecursionError, ValueError):
        size = MAX_TOOLS_JSON_BYTES + 1  # nested too deeply to even measure
    if size > MAX_TOOLS_JSON_BYTES:
        raise ProtocolError("tools_too_large", f"{param} is {size} bytes as JSON; the limit is "
                            f"{MAX_TOOLS_JSON_BYTES}", param, eid)
    return value


TOOL_CHOICES = ("auto", "none", "required")


def checked_tool_choice(value: Any, tools: list[dict[str, Any]], prefix: str,
                        eid: str | None) -> str | dict[str, Any]:
    """`tool_choice`: "auto", "none", "required" or {"type": "function", "name"} of a tool in `tools`."""
    param = f"{prefix}.tool_choice"
    choice: str | dict[str, Any]
    if isinstance(value, str) and value in TOOL_CHOICES:
        choice = value
    elif isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        choice = {"type": "function", "name": value["name"]}
    else:
        raise ProtocolError("invalid_tool_choice", f"{param} must be 'auto', 'none', 'required' or "
                            f"{{\"type\": \"function\", \"name\": ...}}, got {str(value)[:80]!r} (MCP tools are "
                            "not supported)", param, eid)
    declared = {t["name"] for t in tools if t.get("type", "function") == "function"}
    if choice == "required" and not declared:
        raise ProtocolError("invalid_tool_choice", f"{param} 'required' needs at least one function in "
                            f"{prefix}.tools", param, eid)
    if isinstance(choice, dict) and choice["name"] not in declared:
        raise ProtocolError("invalid_tool_choice", f"{param} names the function {choice['name'][:64]!r}, which "
                            f"{prefix}.tools does not declare", param, eid)
    return choice


def _output_modalities(value: Any) -> str | None:
    """["audio"] or ["text"] (beta clients: ["text", "audio"], which is audio with its transcript)."""
    if value == ["text"]:
        return "text"
    # Strings only, before sorting: a client's [null, null] must be refused, not raise in sorted().
    if isinstance(value, list) and len(value) <= 2 and all(isinstance(v, str) for v in value) \
            and sorted(value) in (["audio"], ["audio", "text"]):
        return "audio"
    return None


def checked_output_modality(cfg: dict[str, Any], prefix: str, eid: str | None) -> str | None:
    """`output_modalities` (the beta protocol's `modalities`): what responses carry; None when not given."""
    for name in ("output_modalities", "modalities"):
        if name in cfg:
            modality = _output_modalities(cfg[name])
            if modality is None:
                raise ProtocolError("invalid_output_modalities", f"{prefix}.{name} must be [\"audio\"] or "
                                    f"[\"text\"], got {str(cfg[name])[:80]!r}", f"{prefix}.{name}", eid)
            return modality
    return None


MAX_MEDIA_CLOCK = 10**9  # micro-turns (over six years): a bound, so the value stays a small int


def _media_clock(ext: dict[str, Any], current: SessionSettings, pace: Pace, audio_started: bool,
                 eid: str | None) -> int | None:
    """`session.duplex.media_clock`: a micro-turn number (or null), media pace only, set before any audio."""
    value = ext.get("media_clock", current.media_clock)
    param = "session.duplex.media_clock"
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value <= MAX_MEDIA_CLOCK):
        raise ProtocolError("invalid_media_clock", f"{param} must be null or an integer micro-turn from 0 to "
                            f"{MAX_MEDIA_CLOCK}, got {value!r}", param, eid)
    if value is not None and pace is not Pace.MEDIA:
        raise ProtocolError("invalid_media_clock", f"{param} is for pace 'media' (it places a session on a "
                            "clock shared with other media sessions); set session.pace to 'media' too, or "
                            "media_clock to null",
                            param, eid)
    if value != current.media_clock and audio_started:
        raise ProtocolError("media_clock_locked", f"{param} can only change before the first audio is sent",
                            param, eid)
    return value
