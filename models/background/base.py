"""The background reasoner contract: `Reasoner.stream(messages, tools) -> async iterator of deltas`.

Messages and tools use the OpenAI chat-completions shapes (the lingua franca of every backend here):
messages are `{"role", "content", ...}` dicts, including assistant `tool_calls` and `tool` results;
tools are `{"type": "function", "function": {"name", "description", "parameters"}}`.

What a reasoner does not know: sessions, epochs, the wire protocol, which tools exist or how they
run. server/background.py owns all of that and loops over tool calls itself.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]  # OpenAI chat message
ToolSpec = dict[str, Any]  # OpenAI chat tool: {"type": "function", "function": {...}}
# OpenAI chat `tool_choice`: "auto", "none", "required" or {"type": "function", "function": {"name": ...}}.
ToolChoice = str | dict[str, Any]


@dataclass(frozen=True)
class TextDelta:
    """A piece of the answer text, in order."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """One complete function call the model asked for (its streamed argument fragments joined)."""

    id: str  # call id, echoed back in the tool result message
    name: str
    arguments: str  # JSON text as the model wrote it; may be invalid JSON (the caller reports that)


@dataclass(frozen=True)
class Done:
    """The stream ended normally; no more deltas follow."""

    finish_reason: str  # "stop", "length", "tool_calls", ...
    tokens: int = 0  # completion tokens generated, when the backend knows (0 = unknown)
    # Prompt tokens the backend evaluated for this answer (a prefix kept from an earlier request is not
    # evaluated again), when it knows; None = unknown. Benchmarks and tests read it.
    prompt_evaluated: int | None = None


Delta = TextDelta | ToolCall | Done


class ReasonerError(Exception):
    """The backend failed (unreachable, timed out, malformed stream). The message says what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code  # short machine-readable reason, e.g. "unreachable", "timeout", "malformed"
        self.message = message


@runtime_checkable
class Reasoner(Protocol):
    name: str  # e.g. "llamacpp:SmolLM2-135M-Instruct.Q4_1.gguf", "openai:gpt-4o-mini"
    supports_tools: bool  # False: the backend ignores `tools` (the caller should not offer any)

    def stream(self, messages: list[Message], tools: list[ToolSpec],
               tool_choice: ToolChoice = "auto") -> AsyncGenerator[Delta, None]:
        """Stream one answer. Ends with exactly one `Done`, or raises `ReasonerError`.

        `tool_choice` is the chat-completions field, meaningful only with `tools`; a backend without
        `supports_tools` ignores both.

        Cancelling the consuming task (or `aclose()` on the iterator) stops generation promptly.
        """
        ...

    async def aclose(self) -> None:
        """Release connections, threads and weights."""
        ...


@runtime_checkable
class Concurrency(Protocol):
    """Optional, beside `Reasoner`: how many conversations it answers well at once, measured. A server
    admits no more sessions than that when the operator did not set `--max-sessions` (server/runtime.py):
    past it answers queue behind each other and start after the user has moved on."""

    conversations_at_once: int


@runtime_checkable
class WorkClock(Protocol):
    """Optional, beside `Reasoner`: an in-process reasoner whose compute can be timed (its thread's CPU
    seconds). Media pace counts a request's progress on it (models/background/clock.py)."""

    def work_clock(self) -> float:
        """Seconds of compute done so far (monotonic; only differences are used)."""
        ...
