"""The app's appends on the micro-turn timeline, and who answers a delegation.

A live session's background hook wraps the worker the runtime gave it (`server/background.py`):

- commentary enters the conversation exactly as the background reasoner's answers do, as
  `TickInput.background` chunks (the cascade speaks them; a model that does not speak them, echo,
  still hears them), each with an epoch above every earlier one so the model takes it as the newest;
- thinking goes into the conversation log as a silent note, which the reasoner's context reads;
- instructions are added to the reasoner's instructions (a settings change, through the runtime);
- under client delegation the foreground model's `delegate` events reach the app, not the reasoner;
  under Responses delegation they go to the worker as on `/v1/realtime`.

Each append is acknowledged (`*.appended`) when the micro-turn that takes it is being built, with that
micro-turn's span. The hook is stored as the session's `background`, so it (and the configuration it
carries) lives as long as the session, across a resume. It stands in for runtime verbs that do not exist
yet (/work/notes/live_needs.md: push_context, a delegation switch).
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from models.base import BackgroundChunk, TickOutput
from server import protocol as p
from server.background import BackgroundWorker
from server.limits import MAX_INSTRUCTIONS_CHARS
from server.live.config import LiveConfig
from server.live.events import LiveError
from server.sessions import BackgroundHook, Session
from streaming.types import TICK_SECONDS

if TYPE_CHECKING:
    from server.runtime import Runtime

TICK_MS = round(TICK_SECONDS * 1000)
MAX_APPEND_CHARS = 2000  # one append: the protocol's 500 tokens, at about four characters a token
MAX_PENDING_APPENDS = 32  # appends waiting for their micro-turn
MAX_DELEGATIONS = 256  # delegation ids remembered (an append may name any of them)


@dataclass
class Append:
    kind: str  # "commentary", "thinking" or "instructions"
    content: str
    delegation_id: str | None
    client_event_id: str | None


class LiveContext:
    """The session's `BackgroundHook` while a live connection serves it (module docstring)."""

    def __init__(self, session: Session, inner: BackgroundHook, config: LiveConfig, runtime: Runtime) -> None:
        self.session, self.inner, self.config, self.runtime = session, inner, config, runtime
        self.delegations: OrderedDict[str, str] = OrderedDict()  # delegation id -> worker request id ("" none)
        self._pending: list[Append] = []
        self._epoch = 0  # the newest epoch a commentary chunk carried
        self.started_at = time.time()  # unix time the session started (its `expires_at` counts from here)

    @property
    def context(self) -> object:
        """The worker's reasoner context (its usage report), seen through this wrapper as the other
        BackgroundHook parts are."""
        return getattr(self.inner, "context", None)

    # -- BackgroundHook ------------------------------------------------------------------------

    def drain(self) -> list[BackgroundChunk]:
        chunks = self.inner.drain()
        pending, self._pending = self._pending, []
        for a in pending:
            chunks += self._place(a)
        return chunks

    def on_output(self, out: TickOutput, tick: int) -> None:
        if self.config.delegation_type == "responses":
            self.inner.on_output(out, tick)

    def media_wait(self, tick: int) -> float:
        return self.inner.media_wait(tick)

    async def stop(self) -> None:
        self._pending.clear()
        await self.inner.stop()

    def on_client_event(self, ev: dict[str, Any]) -> bool:
        return self.inner.on_client_event(ev)

    # -- the connection's side -----------------------------------------------------------------

    def new_delegation(self, request_id: str = "") -> str:
        did = p.new_id("item")
        self.delegations[did] = request_id
        while len(self.delegations) > MAX_DELEGATIONS:
            self.delegations.popitem(last=False)
        return did

    def delegation_for(self, request_id: str) -> str | None:
        return next((d for d, r in self.delegations.items() if r == request_id), None)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def append(self, kind: str, ev: dict[str, Any], eid: str | None) -> None:
        """A `session.{kind}.append`: checked now, placed on the next micro-turn."""
        content = ev.get("content")
        if not isinstance(content, str) or not content.strip():
            raise LiveError("invalid_value", f"session.{kind}.append needs a non-empty string 'content'", "content",
                            eid)
        if len(content) > MAX_APPEND_CHARS:
            raise LiveError("string_above_max_length", f"content has {len(content)} characters; an append takes at "
                            f"most {MAX_APPEND_CHARS} (about 500 tokens)", "content", eid)
        if "delegation_id" not in ev:
            raise LiveError("missing_required_parameter", f"session.{kind}.append needs 'delegation_id' (null when "
                            "it answers no delegation)", "delegation_id", eid)
        did = ev["delegation_id"]
        if did is not None and (not isinstance(did, str) or did not in self.delegations):
            raise LiveError("delegation_not_found", f"no delegation {str(did)[:64]!r} in this session", "delegation_id",
                            eid)
        if len(self._pending) >= MAX_PENDING_APPENDS:
            raise LiveError("too_many_pending_appends", f"{len(self._pending)} appends already wait for the next "
                            "micro-turn; is input audio flowing?", None, eid)
        self._pending.append(Append(kind, content, did, eid))

    def _place(self, a: Append) -> list[BackgroundChunk]:
        s = self.session
        start = s.tick * TICK_MS
        chunks: list[BackgroundChunk] = []
        if a.kind == "commentary":
            floor = self.inner.epoch if isinstance(self.inner, BackgroundWorker) else 0
            self._epoch = max(self._epoch, floor) + 1
            chunks.append(BackgroundChunk(p.new_id("commentary"), self._epoch, a.content, done=True))
        elif a.kind == "thinking":
            s.log.add(s.tick * TICK_SECONDS, "system", a.content, kind="note")
        else:
            joined = "\n".join(x for x in (s.settings.instructions, a.content) if x)[-MAX_INSTRUCTIONS_CHARS:]
            self.runtime.settings_changed(s, dataclasses.replace(s.settings, instructions=joined))
        s.emit({"type": f"session.{a.kind}.appended", "event_id": p.new_id("event"), "start_ms": start,
                "end_ms": start + TICK_MS, "client_event_id": a.client_event_id})
        return chunks
