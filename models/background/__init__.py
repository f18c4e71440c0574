"""Background reasoners: slower LLMs with tools whose answers stream into the conversation.

`make_reasoner(kind, ...)` builds one by name; each backend module imports its heavy library lazily
so that a missing optional dependency names itself instead of breaking the server.
"""

from models.background.base import (
    Concurrency,
    Delta,
    Done,
    Message,
    Reasoner,
    ReasonerError,
    TextDelta,
    ToolCall,
    ToolChoice,
    ToolSpec,
)

__all__ = ["Concurrency", "Delta", "Done", "Message", "Reasoner", "ReasonerError", "TextDelta", "ToolCall",
           "ToolChoice", "ToolSpec"]
