"""A GPT-Live session's configuration: `session.start` resolved (defaults filled), checked strictly,
and what `session.update` may change afterwards.

The real service refuses unknown fields and names them in `error.param`; so does this. Model, voice,
instructions, audio format, input and the delegation type are fixed at start (`immutable_field_update`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from server.limits import MAX_INSTRUCTIONS_CHARS, MAX_ITEM_TEXT_CHARS, MAX_TOOLS
from server.live.events import LiveError

DEFAULT_VOICE = "marin"
BUILT_IN_VOICES = frozenset({
    "alloy", "ash", "ballad", "beacon", "bossa", "cedar", "cinder", "coral", "delta", "echo", "gleam", "marin",
    "meridian", "quartz", "ripple", "sage", "shida", "shimmer", "stone", "tempo", "verse", "vesper", "willow",
})
# (type, rate) pairs the WebSocket serves: PCM16 at 24 kHz (default) or 16 kHz, G.711 at 8 kHz.
FORMATS = {("audio/pcm", 24000), ("audio/pcm", 16000), ("audio/pcmu", 8000), ("audio/pcma", 8000)}
MAX_INPUT_MESSAGES = 128  # startup history, as the protocol bounds it
DELEGATION_TYPES = ("client", "responses")

_SESSION_KEYS = {"model", "instructions", "audio", "delegation", "input", "store", "triggers", "client", "duplex"}
# A WebRTC session's (MediaSessionConfig): no audio format (the media track negotiates its codec), and a
# `safety_identifier` (accepted, not used: duplex reports to no one).
_WEBRTC_SESSION_KEYS = _SESSION_KEYS | {"safety_identifier"}
_IMMUTABLE = ("model", "instructions", "audio", "input", "store", "client", "duplex")
PACES = ("realtime", "media")
_RESPONSES_KEYS = {"model", "instructions", "max_output_tokens", "parallel_tool_calls", "reasoning",
                   "service_tier", "text", "tool_choice", "tools"}


@dataclass
class LiveConfig:
    """`session.start.session` with its defaults filled; `describe` echoes it in session.started."""

    model: str
    instructions: str | None = None
    format_type: str = "audio/pcm"
    rate: int = 24000
    voice: str | dict[str, Any] = DEFAULT_VOICE
    delegation: dict[str, Any] = field(default_factory=lambda: {"type": "client"})
    input: list[dict[str, Any]] = field(default_factory=list)
    store: bool = False
    client: dict[str, Any] | None = None
    # duplex's extension: "media" steps a micro-turn as soon as its input has arrived (the timeline
    # then advances with the input audio, faster than real time if it comes faster).
    pace: str = "realtime"

    @property
    def delegation_type(self) -> str:
        return str(self.delegation["type"])

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Client function tools of Responses delegation, in the Realtime shape the worker reads."""
        responses = self.delegation.get("responses") or {}
        return [t for t in responses.get("tools") or [] if t.get("type") == "function"]

    @property
    def reasoner_instructions(self) -> str:
        """What the background reasoner is told: the session's instructions, then the backend's own."""
        responses = self.delegation.get("responses") or {}
        parts = [self.instructions or "", responses.get("instructions") or ""]
        return "\n\n".join(part for part in parts if part)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model, "instructions": self.instructions,
            "audio": {"format": {"type": self.format_type, "rate": self.rate}, "output": {"voice": self.voice}},
            "delegation": copy.deepcopy(self.delegation), "input": copy.deepcopy(self.input), "store": self.store,
        }
        if self.client is not None:
            out["client"] = self.client
        return out


def _obj(value: Any, param: str, eid: str | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LiveError("invalid_type", f"{param} must be an object", param, eid)
    return value


def _known(value: dict[str, Any], allowed: set[str], param: str, eid: str | None) -> None:
    for key in value:
        if key not in allowed:
            name = f"{param}.{str(key)[:64]}"
            raise LiveError("unknown_parameter", f"unknown parameter '{name}'", name, eid)


def resolve(raw: Any, eid: str | None, reasoner: bool, webrtc: bool = False) -> LiveConfig:
    """`session.start.session` -> LiveConfig; LiveError names the first problem. `reasoner`: the server
    runs a background reasoner (Responses delegation needs it). `webrtc`: the configuration of a WebRTC
    session's creation (POST /v1/live/sessions)."""
    s = _obj(raw, "session", eid)
    _known(s, _WEBRTC_SESSION_KEYS if webrtc else _SESSION_KEYS, "session", eid)
    if webrtc and isinstance(s.get("audio"), dict) and s["audio"].get("format") is not None:
        raise LiveError("unknown_parameter", "session.audio.format is for the WebSocket; over WebRTC the media "
                        "track negotiates its codec (Opus)", "session.audio.format", eid)
    if webrtc and s.get("safety_identifier") is not None and not isinstance(s["safety_identifier"], str):
        raise LiveError("invalid_type", "session.safety_identifier must be a string", "session.safety_identifier", eid)
    model = s.get("model")
    if not isinstance(model, str) or not model.strip():
        raise LiveError("missing_required_parameter", "session.model is required (any name: duplex serves every "
                        "name with the model it runs)", "session.model", eid)
    cfg = LiveConfig(model=model[:128])
    instructions = s.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise LiveError("invalid_type", "session.instructions must be a string or null", "session.instructions",
                            eid)
        if len(instructions) > MAX_INSTRUCTIONS_CHARS:
            raise LiveError("string_above_max_length", f"session.instructions has {len(instructions)} characters; "
                            f"the limit is {MAX_INSTRUCTIONS_CHARS}", "session.instructions", eid)
        cfg.instructions = instructions
    if s.get("audio") is not None:
        _audio(cfg, _obj(s["audio"], "session.audio", eid), eid)
    if s.get("delegation") is not None:
        cfg.delegation = delegation(s["delegation"], "session.delegation", eid, reasoner)
    if s.get("input") is not None:
        cfg.input = _input(s["input"], eid)
    store = s.get("store")
    if store is not None:
        if not isinstance(store, bool):
            raise LiveError("invalid_type", "session.store must be true or false", "session.store", eid)
        if store:
            raise LiveError("unsupported_parameter", "session.store is not supported: duplex keeps no recordings "
                            "(send false or leave it out)", "session.store", eid)
    _no_triggers(s.get("triggers"), eid)
    if s.get("client") is not None:
        cfg.client = _obj(s["client"], "session.client", eid)  # WebRTC's; accepted and echoed on the socket
    if s.get("duplex") is not None:
        ext = _obj(s["duplex"], "session.duplex", eid)
        _known(ext, {"pace"}, "session.duplex", eid)
        if ext.get("pace", "realtime") not in PACES:
            raise LiveError("invalid_value", "session.duplex.pace must be 'realtime' or 'media'", "session.duplex.pace",
                            eid)
        cfg.pace = str(ext.get("pace", "realtime"))
    return cfg


def _audio(cfg: LiveConfig, audio: dict[str, Any], eid: str | None) -> None:
    _known(audio, {"format", "output"}, "session.audio", eid)
    if audio.get("format") is not None:
        fmt = _obj(audio["format"], "session.audio.format", eid)
        _known(fmt, {"type", "rate"}, "session.audio.format", eid)
        ftype = fmt.get("type", "audio/pcm")
        rate = fmt.get("rate", 24000 if ftype == "audio/pcm" else 8000)
        if not isinstance(ftype, str) or type(rate) is not int or (ftype, rate) not in FORMATS:
            raise LiveError("invalid_value", f"audio format {ftype!r} at {rate!r} Hz is not supported; use audio/pcm "
                            "at 24000 or 16000, or audio/pcmu or audio/pcma at 8000", "session.audio.format", eid)
        cfg.format_type, cfg.rate = str(ftype), int(rate)
    if audio.get("output") is not None:
        out = _obj(audio["output"], "session.audio.output", eid)
        _known(out, {"voice"}, "session.audio.output", eid)
        voice = out.get("voice", DEFAULT_VOICE)
        if isinstance(voice, dict):
            _known(voice, {"id"}, "session.audio.output.voice", eid)
            if not isinstance(voice.get("id"), str) or not 1 <= len(voice["id"]) <= 128:
                raise LiveError("invalid_value", "a custom voice needs an 'id' of 1-128 characters",
                                "session.audio.output.voice.id", eid)
        elif not isinstance(voice, str) or voice not in BUILT_IN_VOICES:
            raise LiveError("invalid_value", f"unknown voice {str(voice)[:40]!r}; use a built-in name or "
                            "{'id': ...}", "session.audio.output.voice", eid)
        # Every voice name is accepted and echoed; the model duplex runs speaks with its own voice.
        cfg.voice = voice


def delegation(raw: Any, param: str, eid: str | None, reasoner: bool) -> dict[str, Any]:
    d = _obj(raw, param, eid)
    _known(d, {"type", "acknowledgement_delay_ms", "responses", "decisions"}, param, eid)
    dtype = d.get("type", "client")
    if dtype == "decisions" or "decisions" in d:
        raise LiveError("unsupported_parameter", "Decisions delegation is not supported by duplex; use 'client' "
                        "or 'responses'", f"{param}.type", eid)
    if dtype not in DELEGATION_TYPES:
        raise LiveError("invalid_value", f"{param}.type must be 'client' or 'responses'", f"{param}.type", eid)
    out: dict[str, Any] = {"type": dtype}
    delay = d.get("acknowledgement_delay_ms")
    if delay is not None:
        if not isinstance(delay, int) or isinstance(delay, bool) or not 0 <= delay <= 60_000:
            raise LiveError("invalid_value", f"{param}.acknowledgement_delay_ms must be 0..60000",
                            f"{param}.acknowledgement_delay_ms", eid)
        out["acknowledgement_delay_ms"] = delay
    if dtype == "client":
        if "responses" in d:
            raise LiveError("unknown_parameter", f"{param}.responses belongs to Responses delegation",
                            f"{param}.responses", eid)
        return out
    if not reasoner:
        raise LiveError("responses_unavailable", "Responses delegation needs the server's background reasoner; "
                        "this server runs none (start duplex serve with --background)", f"{param}.type", eid)
    out["responses"] = responses(d.get("responses"), f"{param}.responses", eid)
    return out


def responses(raw: Any, param: str, eid: str | None, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """`delegation.responses`, merged over `base` (an update is sparse). `model` names the backend only:
    the server's own reasoner (`--background`) answers whatever it says."""
    r = _obj(raw if raw is not None else {}, param, eid)
    _known(r, _RESPONSES_KEYS, param, eid)
    out = copy.deepcopy(base) if base is not None else {"model": "duplex-background"}
    out.update(copy.deepcopy(r))
    if not isinstance(out.get("model"), str):
        raise LiveError("invalid_type", f"{param}.model must be a string", f"{param}.model", eid)
    if out.get("instructions") is not None and not isinstance(out["instructions"], str):
        raise LiveError("invalid_type", f"{param}.instructions must be a string", f"{param}.instructions", eid)
    tools = out.get("tools") or []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise LiveError("invalid_value", f"{param}.tools must be a list of at most {MAX_TOOLS} tools",
                        f"{param}.tools", eid)
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise LiveError("invalid_value", f"{param}.tools[{i}] needs a 'type'", f"{param}.tools[{i}]", eid)
        if tool["type"] == "function" and not isinstance(tool.get("name"), str):
            raise LiveError("invalid_value", f"{param}.tools[{i}] (a function) needs a 'name'",
                            f"{param}.tools[{i}].name", eid)
    return out


def _input(raw: Any, eid: str | None) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or len(raw) > MAX_INPUT_MESSAGES:
        raise LiveError("invalid_value", f"session.input must be a list of at most {MAX_INPUT_MESSAGES} messages",
                        "session.input", eid)
    out = []
    for i, msg in enumerate(raw):
        param = f"session.input[{i}]"
        m = _obj(msg, param, eid)
        _known(m, {"type", "role", "content", "id", "status"}, param, eid)
        if m.get("role") not in ("developer", "user", "assistant"):
            raise LiveError("invalid_value", f"{param}.role must be developer, user or assistant", f"{param}.role",
                            eid)
        content = m.get("content")
        part = content[0] if isinstance(content, list) and len(content) == 1 else None
        if not (isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
                and isinstance(part.get("text"), str)):
            raise LiveError("invalid_value", f"{param}.content must hold one text part", f"{param}.content", eid)
        if len(part["text"]) > MAX_ITEM_TEXT_CHARS:
            raise LiveError("string_above_max_length", f"{param} has more than {MAX_ITEM_TEXT_CHARS} characters",
                            f"{param}.content", eid)
        out.append(copy.deepcopy(m))
    return out


def _no_triggers(raw: Any, eid: str | None) -> None:
    if raw is None or raw == []:
        return
    raise LiveError("unsupported_parameter", "triggers run Decisions, which duplex does not support",
                    "session.triggers", eid)


def update(cfg: LiveConfig, raw: Any, eid: str | None) -> LiveConfig:
    """`session.update.session` applied to `cfg` (a new LiveConfig); LiveError changes nothing."""
    s = _obj(raw, "session", eid)
    _known(s, _SESSION_KEYS, "session", eid)
    for key in _IMMUTABLE:
        if key in s:
            raise LiveError("immutable_field_update", f"session.{key} cannot change after session.start",
                            f"session.{key}", eid)
    _no_triggers(s.get("triggers"), eid)
    new = copy.deepcopy(cfg)
    if s.get("delegation") is not None:
        d = _obj(s["delegation"], "session.delegation", eid)
        _known(d, {"type", "acknowledgement_delay_ms", "responses", "decisions"}, "session.delegation", eid)
        if d.get("type", cfg.delegation_type) != cfg.delegation_type:
            raise LiveError("immutable_field_update", "session.delegation.type cannot change after session.start",
                            "session.delegation.type", eid)
        if cfg.delegation_type == "client" and "responses" in d:
            raise LiveError("unknown_parameter", "session.delegation.responses belongs to Responses delegation",
                            "session.delegation.responses", eid)
        merged = {**{k: v for k, v in d.items() if k != "responses"}, "type": cfg.delegation_type}
        resolved = delegation(merged, "session.delegation", eid, reasoner=True)
        if cfg.delegation_type == "responses":
            resolved["responses"] = responses(d.get("responses"), "session.delegation.responses", eid,
                                              base=cfg.delegation.get("responses"))
        if "acknowledgement_delay_ms" not in d and "acknowledgement_delay_ms" in cfg.delegation:
            resolved["acknowledgement_delay_ms"] = cfg.delegation["acknowledgement_delay_ms"]
        new.delegation = resolved
    return new
