"""Events the runtime and the background worker emit, in GPT-Live's terms.

The worker (server/background.py) speaks duplex's own `duplex.background.*` events and the Realtime
function-call event; under Responses delegation each becomes a `response.event` envelope around the
Responses streaming event a client reads (`response.created`, `response.output_text.delta`,
`response.output_item.done`, `response.completed` / `response.incomplete` / `response.failed`).
Errors built in the Realtime shape (`error.event_id`) get the protocol's `error.client_event_id`.
"""

from __future__ import annotations

from typing import Any

from server import protocol as p
from server.live.context import TICK_MS, LiveContext

# Realtime acknowledgements that have no GPT-Live counterpart (a function_call_output gets no ack).
_DROPPED = frozenset({"conversation.item.added"})


def _response_id(request_id: str) -> str:
    return f"resp_{request_id}"


def _envelope(ctx: LiveContext, request_id: str | None, event: dict[str, Any]) -> dict[str, Any]:
    delegation_id = ctx.delegation_for(request_id) if request_id else None
    return {"type": "response.event", "event_id": p.new_id("event"), "delegation_id": delegation_id, "event": event}


def _response(ctx: LiveContext, request_id: str, status: str, **extra: Any) -> dict[str, Any]:
    model = (ctx.config.delegation.get("responses") or {}).get("model")
    return {"id": _response_id(request_id), "object": "response", "status": status, "model": model, "output": [],
            **extra}


def _usage(text: str) -> dict[str, Any]:
    """The reasoner reports no token counts: output tokens are estimated at four characters a token."""
    out = (len(text) + 3) // 4
    return {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": out}


def to_live(event: dict[str, Any], ctx: LiveContext | None, tick: int) -> list[dict[str, Any]]:
    """`event` as the GPT-Live client should see it: zero, one or several events."""
    etype = event.get("type")
    if etype == "error":
        err = dict(event.get("error") or {})
        err["client_event_id"] = err.pop("event_id", err.get("client_event_id"))
        return [{**event, "error": err}]
    if etype in _DROPPED:
        return []
    if ctx is None or not str(etype).startswith(("duplex.background.", "response.function_call_arguments.")):
        return [event]
    return _worker_event(event, ctx, tick)


def _worker_event(event: dict[str, Any], ctx: LiveContext, tick: int) -> list[dict[str, Any]]:
    etype, rid = event["type"], event.get("request_id")
    if etype == "duplex.background.started" and isinstance(rid, str):
        did = ctx.new_delegation(rid)
        created = {"type": "session.delegation.created", "event_id": p.new_id("event"), "offset_ms": tick * TICK_MS,
                   "delegation": {"id": did, "type": "delegation", "target": "responses",
                                  "response_id": _response_id(rid)}}
        return [created, _envelope(ctx, rid, {"type": "response.created",
                                              "response": _response(ctx, rid, "in_progress")})]
    if etype == "duplex.background.delta" and isinstance(rid, str):
        return [_envelope(ctx, rid, {"type": "response.output_text.delta", "response_id": _response_id(rid),
                                     "item_id": f"msg_{rid}", "output_index": 0, "content_index": 0,
                                     "delta": event.get("delta", "")})]
    if etype == "duplex.background.done" and isinstance(rid, str):
        text = str(event.get("text") or "")
        if event.get("status") != "completed":
            return [_envelope(ctx, rid, {"type": "response.incomplete", "response": _response(
                ctx, rid, "incomplete", incomplete_details={"reason": str(event.get("reason") or "cancelled")})})]
        item = {"id": f"msg_{rid}", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
        return [_envelope(ctx, rid, {"type": "response.output_item.done", "response_id": _response_id(rid),
                                     "output_index": 0, "item": item}),
                _envelope(ctx, rid, {"type": "response.completed",
                                     "response": _response(ctx, rid, "completed", usage=_usage(text))})]
    if etype == "duplex.background.error":
        err = event.get("error") or {}
        if not isinstance(rid, str):  # refused before it started (a full queue): a plain error
            return [{"type": "error", "event_id": p.new_id("event"),
                     "error": {"type": "server_error", "code": err.get("code"), "message": err.get("message"),
                               "param": None, "client_event_id": event.get("client_event_id")}}]
        return [_envelope(ctx, rid, {"type": "response.failed", "response": _response(ctx, rid, "failed", error={
            "code": err.get("code"), "message": err.get("message")})})]
    if etype == "response.function_call_arguments.done":
        rid = event.get("response_id")
        call: dict[str, Any] = {"id": event.get("item_id"), "type": "function_call", "status": "completed",
                                "call_id": event.get("call_id"), "name": event.get("name"),
                                "arguments": event.get("arguments")}
        return [_envelope(ctx, rid if isinstance(rid, str) else None,
                          {"type": "response.output_item.done", "response_id": rid, "output_index": 0, "item": call})]
    return [event]  # duplex.background.tool (a built-in tool ran on the server): the extension event as is
