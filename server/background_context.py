"""What the background reasoner is told: the session's instructions, the recent conversation with
times (both sides' transcripts, typed text, earlier background results) and the request.

The transcript goes in as one user message rather than alternating turns: in a full-duplex log
both sides talk over each other, and small models follow one timestamped transcript better than a
long run of tiny turns. It is bounded by entries and characters (oldest dropped first).
"""

from __future__ import annotations

from models.background import Message
from server.conversation import ConversationLog

# Short and plain on purpose: the embedded 135M model drifts (even into French) under a long prompt.
SYSTEM_PROMPT = (
    "You are a helpful assistant helping in a live voice conversation; another voice will speak your "
    "answer aloud. Answer briefly, in one or two plain spoken sentences."
)

_LABELS = {("user", "speech"): "User", ("user", "typed"): "User (typed)",
           ("assistant", "speech"): "Assistant", ("background", "background"): "Earlier background result"}


def build_messages(log: ConversationLog, instructions: str, query: str, max_entries: int = 40,
                   max_chars: int = 4000) -> list[Message]:
    system = SYSTEM_PROMPT
    if instructions.strip():
        system += "\n\nInstructions for this conversation: " + instructions.strip()
    lines = []
    for e in log.recent(max_entries):
        label = _LABELS.get((e.role, e.kind)) or e.role.capitalize()
        lines.append(f"[{e.t:6.1f}s] {label}: {e.text}")
    while lines and sum(len(line) + 1 for line in lines) > max_chars:
        lines.pop(0)
    task = query.strip()
    content = f"Conversation so far:\n{chr(10).join(lines)}\n\nTask: {task}" if lines else task
    return [{"role": "system", "content": system}, {"role": "user", "content": content}]
