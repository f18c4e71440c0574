"""What the background reasoner is told: the session's instructions, the conversation with times (both
sides' transcripts, typed text), its own earlier answers, and the request.

The context is a chat that only ever grows at its end: each request adds one user turn (what was said
since the previous request, with times, then the task) and, once answered, the answer as an assistant
turn. So every request's prompt starts with the previous request's prompt and answer, token for
token, and the reasoner's prefix cache (llama.cpp's, SGLang's radix cache) only processes the new
turn. On the embedded CPU model prompt processing runs at ~100 tokens/s on one core, so this is what
keeps the delay from a delegate to the first token short as a conversation gets long.

Bounded: the oldest turns are dropped past `max_turns` or `max_chars` (one cache miss, then stable).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.background import Message
from server.conversation import ConversationLog, Entry

# Short and plain on purpose: the embedded 135M model drifts (even into French) under a long prompt.
SYSTEM_PROMPT = (
    "You are a helpful assistant helping in a live voice conversation; another voice will speak your "
    "answer aloud. Answer briefly, in one or two plain spoken sentences."
)

_LABELS = {("user", "speech"): "User", ("user", "typed"): "User (typed)", ("assistant", "speech"): "Assistant"}


@dataclass
class Turn:
    user: str  # transcript since the previous turn, then the task
    answer: str  # the reasoner's answer to it


@dataclass
class Pending:
    """A user turn built for a request, committed only if the request completes."""

    content: str
    last_entry: Entry | None  # the newest log entry it covered
    last_len: int  # how much of that entry's text it covered (speech entries grow)


@dataclass
class ReasonerContext:
    max_turns: int = 8
    max_chars: int = 6000
    turns: list[Turn] = field(default_factory=list)
    _last_entry: Entry | None = None  # newest log entry already in a committed turn
    _last_len: int = 0

    def build(self, log: ConversationLog, instructions: str, query: str) -> tuple[list[Message], Pending]:
        system = SYSTEM_PROMPT
        if instructions.strip():
            system += "\n\nInstructions for this conversation: " + instructions.strip()
        lines, last, last_len = self._new_lines(log)
        task = query.strip()
        content = f"Conversation so far:\n{chr(10).join(lines)}\n\nTask: {task}" if lines else task
        messages: list[Message] = [{"role": "system", "content": system}]
        for t in self.turns:
            messages += [{"role": "user", "content": t.user}, {"role": "assistant", "content": t.answer}]
        messages.append({"role": "user", "content": content})
        return messages, Pending(content, last, last_len)

    def commit(self, pending: Pending, answer: str) -> None:
        self.turns.append(Turn(pending.content, answer))
        self._last_entry, self._last_len = pending.last_entry, pending.last_len
        # Earlier turns get two thirds of the budget, the next request's new lines the last third.
        while len(self.turns) > self.max_turns or (
                len(self.turns) > 1 and sum(len(t.user) + len(t.answer) for t in self.turns) > self.max_chars * 2 // 3):
            self.turns.pop(0)

    def _new_lines(self, log: ConversationLog) -> tuple[list[str], Entry | None, int]:
        """Log lines not yet in a committed turn (the last covered speech entry may have grown since)."""
        entries = [e for e in log.entries if e.role != "background"]  # our own answers are assistant turns
        start, prefix_len = 0, 0
        if self._last_entry is not None:
            idx = next((i for i in range(len(entries) - 1, -1, -1) if entries[i] is self._last_entry), None)
            if idx is not None:
                grown = len(entries[idx].text) > self._last_len
                start, prefix_len = (idx, self._last_len) if grown else (idx + 1, 0)
        lines = []
        budget = self.max_chars // 3
        for i, e in enumerate(entries[start:]):
            text = e.text[prefix_len:].strip() if i == 0 else e.text
            label = _LABELS.get((e.role, e.kind)) or e.role.capitalize()
            lines.append(f"[{e.t:6.1f}s] {label}: {text}")
        while lines and sum(len(line) + 1 for line in lines) > budget:
            lines.pop(0)  # a long silence of the reasoner: keep the most recent part
        last = entries[-1] if entries else self._last_entry
        return lines, last, len(last.text) if last is not None else 0
