"""What the background reasoner is told: the session's instructions, the conversation (both sides'
transcripts, typed text), its own earlier answers, and the request.

The context is a chat that only ever grows at its end: each request adds one user turn (what was said
since the previous request, and the task) and, once answered, the answer as an assistant
turn. So every request's prompt starts with the previous request's prompt and answer, token for
token, and the reasoner's prefix cache (llama.cpp's, SGLang's radix cache) only processes the new
turn. On the embedded CPU model prompt processing runs at ~100 tokens/s on one core, so this is what
keeps the delay from a delegate to the first token short as a conversation gets long.

Bounded over hours: past `max_turns` or `max_chars` the oldest turns are folded down to half of each (one
cache miss, then several requests that hit) into a running summary, and the facts the user stated in
them (names, numbers, preferences) into a notes block, verbatim (server/context_summary.py: how, and why
by a rule rather than by the reasoner). Both follow the system prompt and change only when turns are
folded, so they are part of the stable prefix; each has its own bound (the oldest lines and notes fall
off past it), so a prompt never grows past the budget however long the session.

How the new user turn reads. When the request is the user's own last words (the voice delegates what
the user asked), the turn is just what the user said since the previous request, as a chat user turn:
the form every chat model is tuned on. Otherwise (a client's task, a model's own query) it is the
transcript since the previous request, then the task. Measured with `python -m bench.answers` on
SmolLM2-135M (the embedded reasoner): the transcript-then-task form, with the question written twice,
made it repeat the question back instead of answering it on 13 of 34 spoken questions ("how do i
look after a goldfish" -> "How do I look after a goldfish?"), against 1 of 34 in the plain form.
No line carries a time: a transcript that arrives a micro-turn late (a busy machine) moved a 0.1 s time
stamp, and so the answer, between two runs of the same conversation; the stamps were also copied into
answers ("[   3.6s] User: ...").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from models.background import Message
from server.context_summary import RunningSummary, user_facts
from server.conversation import ConversationLog, Entry

# Short and plain on purpose: the embedded 135M model drifts (even into French) under a long prompt.
SYSTEM_PROMPT = (
    "You are a helpful assistant helping in a live voice conversation; another voice will speak your "
    "answer aloud. Answer briefly, in one or two plain spoken sentences."
)

_LABELS = {("user", "speech"): "User", ("user", "typed"): "User (typed)", ("assistant", "speech"): "Assistant"}


def _words(text: str) -> str:
    """Lower case words only: how a query and the transcript it came from are compared."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


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
    facts: list[str] = field(default_factory=list)  # what the user stated in the lines it covered


@dataclass
class ReasonerContext:
    max_turns: int = 8
    max_chars: int = 6000
    turns: list[Turn] = field(default_factory=list)
    _last_entry: Entry | None = None  # newest log entry already in a committed turn
    _last_len: int = 0
    summary: RunningSummary | None = None  # what fell off (made with the budget: a quarter and a sixth of it)
    _unnoted: list[str] = field(default_factory=list)  # facts in committed turns, not yet in the notes block
    requests: int = 0  # requests built (how often the context was read)
    prompt_chars: int = 0  # the last request's whole prompt

    def __post_init__(self) -> None:
        if self.summary is None:
            self.summary = RunningSummary(self.max_chars // 4, self.max_chars // 6)

    def build(self, log: ConversationLog, instructions: str, query: str) -> tuple[list[Message], Pending]:
        assert self.summary is not None
        self.requests += 1
        system = SYSTEM_PROMPT
        if instructions.strip():
            system += "\n\nInstructions for this conversation: " + instructions.strip()
        if kept := self.summary.text():
            system += "\n\n" + kept
        every, last, last_len = self._new_lines(log)
        facts = [f for e, text in every if e.role == "user" for f in user_facts(text)]
        lines = _within(every, self.max_chars // 3)
        content = _turn(lines, query.strip())
        # Facts said in lines that did not fit this turn (a long stretch without a request) come along.
        shown = "\n".join(text for _, text in lines)
        missing = [f for f in facts if f not in shown and f not in self.summary.notes]
        if missing:
            content = "Earlier the user said:\n" + "\n".join(f"- {f}" for f in missing) + "\n\n" + content
        messages: list[Message] = [{"role": "system", "content": system}]
        for t in self.turns:
            messages += [{"role": "user", "content": t.user}, {"role": "assistant", "content": t.answer}]
        messages.append({"role": "user", "content": content})
        self.prompt_chars = sum(len(m["content"]) for m in messages)
        return messages, Pending(content, last, last_len, facts)

    def commit(self, pending: Pending, answer: str) -> None:
        assert self.summary is not None
        self.turns.append(Turn(pending.content, answer))
        self._unnoted += pending.facts
        self._last_entry, self._last_len = pending.last_entry, pending.last_len
        # Earlier turns get two thirds of the budget, the next request's new lines the last third. Past
        # it, the oldest turns are folded into the summary until half the budget is left, not one at a
        # time: every fold changes the prompt's start, so the prefix cache re-reads the whole
        # conversation once; folding one turn per request made that miss happen on every request.
        if self._over(self.max_turns, self.max_chars * 2 // 3):
            folded = []
            while len(self.turns) > 1 and self._over(self.max_turns // 2, self.max_chars // 3):
                folded.append(self.turns.pop(0))
            self.summary.fold((t.user, t.answer) for t in folded)
            self.summary.note(self._unnoted)  # the kept turns' facts too: the prefix changes only now
            self._unnoted = []

    def usage(self) -> dict[str, object]:
        """How full the context is and what was summarised (duplex.session.usage)."""
        assert self.summary is not None
        chars = sum(len(t.user) + len(t.answer) for t in self.turns)
        budget = self.max_chars * 2 // 3
        return {"turns": len(self.turns), "chars": chars, "budget_chars": budget,
                "usage_ratio": round(min(1.0, chars / budget), 3) if budget else 0.0,
                "requests": self.requests, "prompt_chars": self.prompt_chars, "summarised_turns": self.summary.folded,
                "summary_chars": self.summary.chars(), "notes": len(self.summary.notes),
                "dropped_summary_lines": self.summary.lines_dropped, "dropped_notes": self.summary.notes_dropped}

    def _over(self, turns: int, chars: int) -> bool:
        return len(self.turns) > turns or sum(len(t.user) + len(t.answer) for t in self.turns) > chars

    def _new_lines(self, log: ConversationLog) -> tuple[list[tuple[Entry, str]], Entry | None, int]:
        """Log entries not yet in a committed turn, each with its new text (the last covered speech
        entry may have grown since)."""
        entries = [e for e in log.entries if e.role != "background"]  # our own answers are assistant turns
        start, prefix_len = 0, 0
        if self._last_entry is not None:
            idx = next((i for i in range(len(entries) - 1, -1, -1) if entries[i] is self._last_entry), None)
            if idx is not None:
                grown = len(entries[idx].text) > self._last_len
                start, prefix_len = (idx, self._last_len) if grown else (idx + 1, 0)
        lines = []
        for i, e in enumerate(entries[start:]):
            text = e.text[prefix_len:].strip() if i == 0 else e.text.strip()
            if text:
                lines.append((e, text))
        last = entries[-1] if entries else self._last_entry
        return lines, last, len(last.text) if last is not None else 0


def _within(lines: list[tuple[Entry, str]], budget: int) -> list[tuple[Entry, str]]:
    """The newest lines that fit `budget` (a long silence of the reasoner: keep the most recent part)."""
    lines = list(lines)
    while lines and sum(len(text) + 16 for _, text in lines) > budget:  # 16: a line's label
        lines.pop(0)
    return lines


def _turn(lines: list[tuple[Entry, str]], task: str) -> str:
    """The new user turn: the user's words when the task is what they said last, else the transcript
    since the previous request and the task (module docstring)."""
    said = [text for e, text in lines if e.role == "user"]
    heard, asked = _words(" ".join(said)), _words(task)
    if said and asked and f" {heard}".endswith(f" {asked}"):
        return "\n".join(said)
    if not lines:
        return task
    transcript = "\n".join(text if e.kind == "vision" else  # "Camera: ...", what was in view
                           f"{_LABELS.get((e.role, e.kind)) or e.role.capitalize()}: {text}" for e, text in lines)
    return f"Conversation so far:\n{transcript}\n\nTask: {task}"
