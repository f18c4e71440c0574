"""Tool calls the client executes, the Realtime way: the call goes out as
`response.function_call_arguments.done`, and the client's `function_call_output` item comes back.
One per session's background worker (server/background.py).

`session.tool_choice` decides, per background request, what the reasoner is offered and which of its
calls run (`ToolPolicy`): `auto`, every tool, the reasoner chooses; `none`, the tools are still
described (the prompt's prefix stays the same) with the chat API's `tool_choice: "none"`, and a call
the reasoner makes anyway is not run; `required`, the request's first round offers only the client's
declared tools with `tool_choice: "required"`; `{"type": "function", "name": X}`, the first round asks
for X (`{"type": "function", "function": {"name": X}}`). Once a forced call's output is back, later
rounds are `auto`, so the reasoner answers in words instead of calling again and again. The embedded
llama-server reasoner routes instead of writing calls (models/background/tool_routing.py): it is
offered the client's declared tools only, honours all four choices (under `none` a request a tool
covers is answered with "I can't do that here", never a guessed result), and answers a call's output
with the output itself. A reasoner without tools (`supports_tools` False: the in-process llama.cpp and
SGLang ones) is offered none and told nothing: there `none` holds trivially, and `required` or a named
function cannot be forced (it answers in words).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from models.background import ToolCall, ToolChoice, ToolSpec
from server import protocol as p
from server.limits import MAX_FUNCTION_OUTPUT_CHARS
from server.sessions import Session
from server.tools import ToolResult, error_result

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolPolicy:
    """What one background request may do with tools, from the session's `tool_choice` (Realtime form)."""

    choice: str | dict[str, Any] = "auto"

    @property
    def forced(self) -> bool:
        return self.choice == "required" or isinstance(self.choice, dict)

    def offer(self, round_no: int, client: list[ToolSpec], builtin: list[ToolSpec]) -> tuple[list[ToolSpec],
                                                                                              ToolChoice]:
        """The tools offered in round `round_no` (0: the request's first call) and the chat `tool_choice`."""
        if round_no > 0 and self.forced:
            return client + builtin, "auto"  # the forced call was made; now the reasoner may answer
        if self.choice == "required":
            return client, "required"  # a call of one of the client's declared tools, not a built-in
        if isinstance(self.choice, dict):
            return client + builtin, {"type": "function", "function": {"name": self.choice["name"]}}
        return client + builtin, str(self.choice)

    def allowed(self, calls: list[ToolCall], session_id: str) -> list[ToolCall]:
        """The calls that run: none under `none` (a reasoner that calls anyway is overruled)."""
        if self.choice != "none" or not calls:
            return calls
        log.warning("session %s: the reasoner called %s under tool_choice 'none'; not run", session_id,
                    ", ".join(c.name for c in calls))
        return []


class ClientTools:
    def __init__(self, session: Session) -> None:
        self.session = session
        self._calls: dict[str, asyncio.Future[str]] = {}  # wire call_id -> the client's output

    async def call(self, request_id: str, call: ToolCall, timeout: float) -> ToolResult:
        """Send the call to the client and wait up to `timeout` s for its output."""
        call_id = "call_" + secrets.token_hex(8)  # ours, unique per session (model ids may repeat)
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        self.session.emit({"type": "response.function_call_arguments.done", "event_id": p.new_id("event"),
                           "response_id": request_id, "item_id": p.new_id("item"), "output_index": 0,
                           "call_id": call_id, "name": call.name, "arguments": call.arguments})
        try:
            output = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return error_result(call.name, f"the client did not return a function_call_output for call "
                                f"{call_id} within {timeout:g} s")
        finally:
            self._calls.pop(call_id, None)
        return ToolResult(output, ok=True)

    def output(self, item: dict[str, Any], eid: str | None) -> None:
        """A `function_call_output` item from the client: the output of the call it names."""
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not isinstance(output, str):
            self._error("invalid_function_call_output", "a function_call_output item needs string "
                        "'call_id' and 'output' fields", "item", eid)
            return
        if len(output) > MAX_FUNCTION_OUTPUT_CHARS:
            self._error("function_output_too_large", f"function_call_output has {len(output)} characters; "
                        f"the limit is {MAX_FUNCTION_OUTPUT_CHARS}", "item.output", eid)
            return
        fut = self._calls.get(call_id)
        if fut is None or fut.done():
            self._error("unknown_call_id", f"no background tool call {call_id!r} is waiting for "
                        "output (it finished, timed out or was cancelled)", "item.call_id", eid)
            return
        fut.set_result(output)
        self.session.emit({"type": "conversation.item.added", "event_id": p.new_id("event"),
                           "previous_item_id": None, "item": {"id": item.get("id") or p.new_id("item"),
                                                              "type": "function_call_output",
                                                              "call_id": call_id, "output": output}})

    def cancel_all(self) -> None:
        for fut in self._calls.values():
            fut.cancel()

    def _error(self, code: str, message: str, param: str | None, eid: str | None) -> None:
        self.session.emit(p.error_event(code, message, param, eid))
