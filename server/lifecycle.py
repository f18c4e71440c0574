"""The Realtime API's item lifecycle: the events that announce, fill and close a response and its items.

Agent frameworks keep their own mirror of the conversation and act only on these events: audio for an
item no `response.output_item.added` announced is dropped, a tool runs only on a completed
`function_call` item. Every function here returns the events in the order the API sends them; the
caller emits them. Shapes follow the `openai` SDK's `openai.types.realtime` models (tests validate them).
"""

from __future__ import annotations

from typing import Any

from server import protocol as p

Event = dict[str, Any]


def _ev(etype: str, **fields: Any) -> Event:
    return {"type": etype, "event_id": p.new_id("event"), **fields}


def response(rid: str, status: str, output: list[dict[str, Any]], modality: str = "audio",
             reason: str | None = None, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """A `realtime.response` object; `reason` for a cancelled or incomplete one (turn_detected, client_cancelled);
    `metadata` what `response.create` attached to it, echoed."""
    resp: dict[str, Any] = {"id": rid, "object": "realtime.response", "status": status, "output": output,
                            "output_modalities": [modality], "conversation_id": None, "usage": _usage(output)}
    if metadata is not None:
        resp["metadata"] = metadata
    if status != "in_progress":
        details: dict[str, Any] = {"type": status}
        if reason is not None:
            details["reason"] = reason
        resp["status_details"] = details
    return resp


def _usage(output: list[dict[str, Any]]) -> dict[str, Any]:
    # No tokens are billed here; words stand in for output tokens so a framework's counters move.
    words = sum(len(str(part.get("transcript") or part.get("text") or "").split())
                for item in output for part in item.get("content", []) if isinstance(part, dict))
    return {"total_tokens": words, "input_tokens": 0, "output_tokens": words,
            "input_token_details": {"text_tokens": 0, "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": words, "audio_tokens": 0}}


def created(rid: str, modality: str = "audio", metadata: dict[str, str] | None = None) -> list[Event]:
    return [_ev("response.created", response=response(rid, "in_progress", [], modality, metadata=metadata))]


def assistant_item(item_id: str, status: str, modality: str = "audio", text: str | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text is not None:
        content = [{"type": "output_audio", "transcript": text} if modality == "audio"
                   else {"type": "output_text", "text": text}]
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant", "status": status,
            "content": content}


def message_opened(rid: str, item_id: str, previous: str | None, modality: str = "audio") -> list[Event]:
    """After `response.created`: the assistant's message item and its one content part, announced."""
    item = assistant_item(item_id, "in_progress", modality)
    # The part's type is the API's "audio" or "text" (the item's content says "output_audio" / "output_text").
    part = {"type": "audio", "transcript": ""} if modality == "audio" else {"type": "text", "text": ""}
    return [_ev("response.output_item.added", response_id=rid, output_index=0, item=item),
            _ev("conversation.item.added", previous_item_id=previous, item=item),
            _ev("response.content_part.added", response_id=rid, item_id=item_id, output_index=0, content_index=0,
                part=part)]


def message_closed(rid: str, item_id: str, text: str, status: str, modality: str = "audio",
                   reason: str | None = None, metadata: dict[str, str] | None = None) -> list[Event]:
    """The part, the item and the response closed; `status` is the response's (completed, cancelled)."""
    at = {"response_id": rid, "item_id": item_id, "output_index": 0, "content_index": 0}
    item_status = "completed" if status == "completed" else "incomplete"
    item = assistant_item(item_id, item_status, modality, text)
    if modality == "audio":
        events = [_ev("response.output_audio.done", **at),
                  _ev("response.output_audio_transcript.done", **at, transcript=text),
                  _ev("response.content_part.done", **at, part={"type": "audio", "transcript": text})]
    else:
        events = [_ev("response.output_text.done", **at, text=text),
                  _ev("response.content_part.done", **at, part={"type": "text", "text": text})]
    return [*events, _ev("response.output_item.done", response_id=rid, output_index=0, item=item),
                     _ev("conversation.item.done", previous_item_id=None, item=item),
                     _ev("response.done", response=response(rid, status, [item], modality, reason, metadata))]


def function_call(rid: str, item_id: str, call_id: str, name: str, arguments: str,
                  previous: str | None, modality: str = "audio",
                  metadata: dict[str, str] | None = None) -> list[Event]:
    """A whole response whose output is one `function_call` item, as the API streams it."""
    opened = {"id": item_id, "object": "realtime.item", "type": "function_call", "status": "in_progress",
              "call_id": call_id, "name": name, "arguments": ""}
    done = {**opened, "status": "completed", "arguments": arguments}
    at = {"response_id": rid, "item_id": item_id, "output_index": 0, "call_id": call_id}
    return [_ev("response.created", response=response(rid, "in_progress", [], modality, metadata=metadata)),
            _ev("response.output_item.added", response_id=rid, output_index=0, item=opened),
            _ev("conversation.item.added", previous_item_id=previous, item=opened),
            _ev("response.function_call_arguments.delta", **at, delta=arguments),
            _ev("response.function_call_arguments.done", **at, name=name, arguments=arguments),
            _ev("response.output_item.done", response_id=rid, output_index=0, item=done),
            _ev("conversation.item.done", previous_item_id=previous, item=done),
            _ev("response.done", response=response(rid, "completed", [done], modality, metadata=metadata))]


def user_audio_item(item_id: str, transcript: str | None) -> dict[str, Any]:
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_audio", "transcript": transcript}]}


def user_committed(item_id: str, previous: str | None) -> list[Event]:
    """The user's turn became an item: committed, then added (its transcript to follow)."""
    return [_ev("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous),
            _ev("conversation.item.added", previous_item_id=previous, item=user_audio_item(item_id, None))]


def user_transcribed(item_id: str, transcript: str, seconds: float, deltas: list[str]) -> list[Event]:
    """The turn's transcript (any deltas held back, then completed with usage), then the item done."""
    events = [_ev("conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0, delta=d)
              for d in deltas]
    return [
        *events,
        _ev("conversation.item.input_audio_transcription.completed", item_id=item_id, content_index=0,
            transcript=transcript, usage={"type": "duration", "seconds": round(max(seconds, 0.0), 3)}),
        _ev("conversation.item.done", previous_item_id=None, item=user_audio_item(item_id, transcript))]
