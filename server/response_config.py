"""`response.create`'s `response` object: settings for one response, checked as `session.update` checks them.

Agent frameworks send per-response settings with `response.create`. Full duplex has no turns: the model
decides every micro-turn when to speak, so a `response.create` cannot start a response of its own. What
it configures is therefore the next of each thing a response is made of, once:

- the reasoner's side (`instructions`, `tools`, `tool_choice`): the next background request
  (server/background.py takes it when the request starts, whoever asked for it);
- the output's side (`output_modalities`, `metadata`): the next response announced, an answer or a
  tool call's (server/realtime_output.py and server/realtime.py take it when it opens).

A later `response.create` replaces what an earlier one left untaken (a plain one: back to the session's
settings). The session's own settings never change. Fields duplex cannot honour are refused, not
ignored, so a framework that relies on them finds out: `conversation: "none"` (out-of-band responses)
and `input` (a response from other context than the conversation) would need a second conversation the
one model does not have; `prompt` (a stored prompt template) cannot be fetched here.
"""

from __future__ import annotations

from typing import Any

from server import protocol as p
from server._session_update import (
    checked_instructions,
    checked_output_modality,
    checked_tool_choice,
    checked_tools,
)
from server.protocol import ProtocolError
from server.sessions import OutputConfig, RequestConfig, Session, SessionSettings

PREFIX = "response"
# The fields of the API's RealtimeResponseCreateParams (and the beta protocol's names for some of them).
HONOURED = {"instructions", "tools", "tool_choice", "output_modalities", "modalities", "metadata"}
# Checked, then advisory: the reasoner's token limit is set per server, and duplex speaks with its
# model's own voice (session.update ignores `voice` too); sampling and reasoning knobs are the reasoner's.
ADVISORY = {"max_output_tokens", "max_response_output_tokens", "audio", "voice", "output_audio_format",
            "temperature", "parallel_tool_calls", "reasoning"}
REFUSED = {"conversation", "input", "prompt"}
KNOWN = HONOURED | ADVISORY | REFUSED
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512  # as the API documents
MAX_OUTPUT_TOKENS = 4096  # the API's bound for an integer max_output_tokens ("inf" otherwise)


def parse(cfg: Any, settings: SessionSettings, eid: str | None) -> tuple[RequestConfig | None, OutputConfig | None]:
    """The `response` object checked (ProtocolError for the first bad field; nothing is kept then), as its
    two sides; None for a side it leaves to the session."""
    if cfg is None:
        return None, None
    if not isinstance(cfg, dict):
        raise ProtocolError("invalid_response", "'response' must be an object", PREFIX, eid)
    unknown = sorted(str(k) for k in cfg if k not in KNOWN)
    if unknown:
        names = ", ".join(repr(f"{PREFIX}.{k[:40]}") for k in unknown[:8])
        raise ProtocolError("unknown_parameter", f"unknown parameter(s): {names}", f"{PREFIX}.{unknown[0][:40]}",
                            eid)
    _refuse_unsupported(cfg, eid)
    _check_advisory(cfg, settings, eid)
    instructions = checked_instructions(cfg["instructions"], PREFIX, eid) if "instructions" in cfg else None
    tools = checked_tools(cfg["tools"], PREFIX, eid) if "tools" in cfg else None
    # A forced function must be among the tools that response offers: its own, else the session's.
    choice = checked_tool_choice(cfg["tool_choice"], settings.tools if tools is None else tools, PREFIX, eid) \
        if "tool_choice" in cfg else None
    modality = checked_output_modality(cfg, PREFIX, eid)
    metadata = _metadata(cfg.get("metadata"), eid)
    request = RequestConfig(instructions, tools, choice) \
        if (instructions, tools, choice) != (None, None, None) else None
    output = OutputConfig(modality, metadata) if (modality, metadata) != (None, None) else None
    return request, output


def _refuse_unsupported(cfg: dict[str, Any], eid: str | None) -> None:
    conversation = cfg.get("conversation", "auto")
    if conversation != "auto":
        raise ProtocolError("out_of_band_unsupported", f"{PREFIX}.conversation must be 'auto': out-of-band "
                            f"responses ({str(conversation)[:40]!r}) are not supported, since duplex's one model "
                            "answers from the one conversation it hears", f"{PREFIX}.conversation", eid)
    if "input" in cfg:
        raise ProtocolError("response_input_unsupported", f"{PREFIX}.input is not supported: a response is made "
                            "from the conversation as heard, not from items given for it; send them with "
                            "conversation.item.create instead", f"{PREFIX}.input", eid)
    if cfg.get("prompt") is not None:
        raise ProtocolError("prompt_unsupported", f"{PREFIX}.prompt (a stored prompt template) is not supported; "
                            f"send the text as {PREFIX}.instructions", f"{PREFIX}.prompt", eid)


def _check_advisory(cfg: dict[str, Any], settings: SessionSettings, eid: str | None) -> None:
    """Fields accepted without effect are still checked, so a bad value is an error here as on the API."""
    for name in ("max_output_tokens", "max_response_output_tokens"):
        value = cfg.get(name, "inf")
        if value != "inf" and (isinstance(value, bool) or not isinstance(value, int)
                               or not 1 <= value <= MAX_OUTPUT_TOKENS):
            raise ProtocolError("invalid_max_output_tokens", f"{PREFIX}.{name} must be an integer from 1 to "
                                f"{MAX_OUTPUT_TOKENS} or 'inf', got {str(value)[:40]!r}", f"{PREFIX}.{name}", eid)
    audio = cfg.get("audio", {})
    output = audio.get("output", {}) if isinstance(audio, dict) else None
    if not isinstance(output, dict):
        raise ProtocolError("invalid_response", f"{PREFIX}.audio must be an object {{output: {{format, voice}}}}",
                            f"{PREFIX}.audio", eid)
    # The audio format is the connection's (its encoder and resampler): a response may only restate it.
    for param, value in ((f"{PREFIX}.audio.output.format", output.get("format")),
                         (f"{PREFIX}.output_audio_format", cfg.get("output_audio_format"))):
        if value is not None and p.parse_format(value, param, eid) != settings.out_format:
            raise ProtocolError("response_format_unsupported", f"{param} differs from the session's output "
                                "format; a response cannot change it (use session.update)", param, eid)


def _metadata(value: Any, eid: str | None) -> dict[str, str] | None:
    """At most 16 string pairs, keys up to 64 characters and values up to 512, as the API documents."""
    param = f"{PREFIX}.metadata"
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METADATA_KEY_CHARS
            and len(v) <= MAX_METADATA_VALUE_CHARS for k, v in value.items()):
        raise ProtocolError("invalid_metadata", f"{param} must be an object of at most {MAX_METADATA_KEYS} "
                            f"string values, keys up to {MAX_METADATA_KEY_CHARS} characters and values up to "
                            f"{MAX_METADATA_VALUE_CHARS}", param, eid)
    return dict(value)


def take_request(session: Session) -> RequestConfig:
    """The next background request's side, taken: a later request has the session's settings again."""
    config, session.next_request = session.next_request or RequestConfig(), None
    return config


def take_output(session: Session) -> OutputConfig:
    """The next response's side, taken: a later response has the session's settings again."""
    config, session.next_output = session.next_output or OutputConfig(), None
    return config
