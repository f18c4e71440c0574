"""Background orchestration: one worker per session, between the foreground model and a reasoner.

A request starts when the foreground model emits a `delegate` event or the client sends
`duplex.background.request`. The worker builds context from the session's conversation log, streams
the reasoner's answer, runs its tool calls, and delivers every piece twice: into `drain()`, which the
engine calls for the next micro-turn's `TickInput.background`, and to the client as
`duplex.background.*` events.

Epochs: each request gets the next epoch number. Under the `supersede` policy (default) a new request
raises the floor to its own epoch and cancels what runs or waits; under `queue` it waits its turn.
Chunks below the floor are stale: they are never queued and, if already queued, never drained.

Nothing here can stall the session: reasoner failures, timeouts and tool failures end as an error
event plus an error chunk, and the next request works as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from models.background import Reasoner, ReasonerError, TextDelta, ToolCall, ToolSpec
from models.background.base import WorkClock
from models.background.clock import RequestClock, SharedWork
from models.base import BackgroundChunk, TickOutput
from server import protocol as p
from server.background_context import Pending, ReasonerContext
from server.client_tools import ClientTools, ToolPolicy
from server.metrics import Metrics
from server.rate_limit import background_requests, retry_after
from server.response_config import RequestConfig, take_request
from server.sessions import Pace, Session
from server.tools import BUILTIN_NAMES, BUILTIN_TOOLS, ToolResult, client_tools_to_chat, error_result, run_builtin_async
from streaming.types import TICK_SECONDS

log = logging.getLogger(__name__)

MAX_QUERY_CHARS = 4000


class Policy(StrEnum):
    SUPERSEDE = "supersede"  # a new request cancels the running and waiting ones
    QUEUE = "queue"  # a new request waits for the ones before it


@dataclass
class BackgroundSettings:
    policy: Policy = Policy.SUPERSEDE
    request_timeout: float = 60.0  # s for a whole request, tool calls included
    tool_timeout: float = 15.0  # s a client-executed tool may take
    max_tool_rounds: int = 4  # reasoner -> tools -> reasoner cycles per request
    max_queue: int = 4  # requests waiting under the queue policy
    context_turns: int = 8  # earlier request/answer pairs kept in the reasoner's context
    context_chars: int = 6000  # and at most this much text in them


@dataclass
class _Request:
    id: str
    epoch: int
    query: str
    source: str  # "model" (delegate event) or "client"
    ask: int | None = None  # the delegate event's own number for its question, given back in every chunk
    start_tick: int = 0  # micro-turn whose output asked for it (its virtual clock)
    text: list[str] = field(default_factory=list)  # answer so far
    context: Pending | None = None  # its turn in the reasoner's context, committed when it completes
    asked: float = field(default_factory=time.monotonic)  # wall time it was asked (metrics)
    # What a response.create asked of this request (instructions, tools, tool_choice); the rest is the session's.
    config: RequestConfig = field(default_factory=RequestConfig)

    @property
    def said(self) -> str:
        return "".join(self.text)


class BackgroundWorker:
    """Implements `BackgroundHook` for one session."""

    def __init__(self, session: Session, reasoner: Reasoner, settings: BackgroundSettings | None = None,
                 metrics: Metrics | None = None, shared: SharedWork | None = None) -> None:
        self.session = session
        self.reasoner = reasoner
        self.settings = settings or BackgroundSettings()
        self.metrics = metrics
        self.epoch = 0  # last epoch handed out
        self.floor = 0  # chunks of epochs below this are stale
        # (due micro-turn, chunk): delivered at the micro-turn its virtual-clock stamp says.
        self._pending: list[tuple[int, BackgroundChunk]] = []
        # The running request on the session's micro-turns: in media pace an in-process reasoner's by its
        # work clock, shared with the other sessions (one per reasoner: server/startup.py).
        if shared is None and isinstance(reasoner, WorkClock):
            shared = SharedWork(reasoner.work_clock)
        self.shared = shared
        self.clock = RequestClock(TICK_SECONDS)
        self._clocked: _Request | None = None  # the request the clock is timing
        self._waiting: deque[_Request] = deque()  # queue policy
        self._current: _Request | None = None
        self._runner: asyncio.Task[None] | None = None
        self._client_tools = ClientTools(session)  # tool calls the client executes
        self._client_rate = background_requests()  # the client's own requests (server/rate_limit.py)
        self._stopped = False
        self.context = ReasonerContext(self.settings.context_turns, self.settings.context_chars)

    # -- BackgroundHook ---------------------------------------------------------------------------

    def drain(self) -> list[BackgroundChunk]:
        # Called while the engine takes micro-turn `session.tick`'s input (only what is due).
        tick = self.session.tick
        out = [c for due, c in self._pending if c.epoch >= self.floor and due <= tick]
        self._pending = [(due, c) for due, c in self._pending if c.epoch >= self.floor and due > tick]
        return out

    def media_wait(self, tick: int) -> float:
        """Seconds before micro-turn `tick` may be stepped in media pace (its virtual clock)."""
        return self.clock.wait_before(tick)

    def on_output(self, out: TickOutput, tick: int) -> None:
        for ev in out.events:
            if ev.type != "delegate":
                continue
            query, ask = ev.data.get("query"), ev.data.get("ask")
            if isinstance(query, str) and query.strip():
                self.request(query, source="model", tick=tick, ask=ask if isinstance(ask, int) else None)
            else:
                log.warning("session %s: delegate event without a query string: %r", self.session.id, ev.data)

    async def stop(self) -> None:
        self._stopped = True
        for _ in self._unfinished():
            self._count("cancelled")
        self._waiting.clear()
        self._client_tools.cancel_all()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
            self._runner = None

    def on_client_event(self, ev: dict[str, Any]) -> bool:
        etype = ev.get("type")
        eid = ev.get("event_id") if isinstance(ev.get("event_id"), str) else None
        if etype == "duplex.background.request":
            self._client_request(ev, eid)
            return True
        item = ev.get("item")
        is_output = isinstance(item, dict) and item.get("type") == "function_call_output"
        if etype == "conversation.item.create" and isinstance(item, dict) and is_output:
            self._client_tools.output(item, eid)
            return True
        return False

    # -- requests ---------------------------------------------------------------------------------

    def request(self, query: str, source: str, policy: Policy | None = None,
                client_event_id: str | None = None, tick: int | None = None, ask: int | None = None) -> str | None:
        """Start (or queue) a request; returns its id, or None if it was refused (an error was sent)."""
        if self._stopped:
            return None
        policy = policy or self.settings.policy
        if policy is Policy.QUEUE and len(self._waiting) >= self.settings.max_queue:
            message = (f"{len(self._waiting)} background requests are already waiting; wait for one to "
                       "finish or send this one with policy 'supersede'")
            self._emit("duplex.background.error", request_id=None, epoch=self.epoch,
                       error={"code": "queue_full", "message": message}, client_event_id=client_event_id)
            return None
        self.epoch += 1
        req = _Request(id=p.new_id("bg"), epoch=self.epoch, query=query, source=source, ask=ask,
                       start_tick=max(0, self.session.tick - 1) if tick is None else tick,
                       config=take_request(self.session))  # taken now: the next request is the session's
        if policy is Policy.SUPERSEDE:
            self._supersede(req.epoch)
        queued = self._current is not None
        self._emit("duplex.background.started", request_id=req.id, epoch=req.epoch, query=query,
                   source=source, policy=policy.value, queued=queued, client_event_id=client_event_id)
        if queued:
            self._waiting.append(req)
        else:
            self._current = req
            self._runner = asyncio.get_running_loop().create_task(self._run(req),
                                                                  name=f"background-{self.session.id}")
        return req.id

    def _supersede(self, epoch: int) -> None:
        """Everything before `epoch` is stale: drop it from the queue, the pending chunks and the runner."""
        self.floor = epoch
        self._pending = [(due, c) for due, c in self._pending if c.epoch >= epoch]
        cancelled = self._unfinished()
        self._waiting.clear()
        for old in cancelled:
            self._count("cancelled")
            self._emit("duplex.background.done", request_id=old.id, epoch=old.epoch, status="cancelled",
                       reason="superseded", text="".join(old.text))
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()  # its stream is closed at its next await; late chunks fall below the floor
        self._runner = None
        self._current = None

    async def _run(self, req: _Request | None) -> None:
        """Serve `req`, then whatever queued behind it, one at a time."""
        while req is not None and not self._stopped:
            self._current = req
            try:
                await self._serve(req)
            finally:
                # A superseded runner ends after its successor started: leave the successor's mark alone.
                if self._current is req:
                    self._current = None
            # No await between here and the next `_current = req`: request() never sees a gap.
            req = self._waiting.popleft() if self._waiting else None

    async def _serve(self, req: _Request) -> None:
        self._start_clock(req)
        self._clocked = req
        try:
            await self._serve_timed(req)
        finally:
            if self._clocked is req:  # a superseded runner ends after its successor started
                self.clock.finish()
                self._clocked = None
                if self.shared is not None:
                    self.shared.discard(self.clock)

    def _start_clock(self, req: _Request) -> None:
        """Time `req` on the session's virtual clock (models/background/clock.py)."""
        # A queued request starts, on the virtual clock, when the one before it ended.
        start = max(req.start_tick, self.clock.end_tick)
        settings = self.session.settings
        if settings.pace is not Pace.MEDIA or self.shared is None:
            self.clock.work = None  # real time (a piece is due when it exists), or a remote reasoner
            self.clock.start(start)
            return
        self.clock.work = self.shared.work
        offset = settings.media_clock
        if offset is None or start > req.start_tick:
            # On its own, or queued behind this session's last request: the work clock now stands for
            # `start` (that request has just ended there).
            self.clock.start(start)
        else:
            self.clock.start(start, work_at=self.shared.now(offset + start))
        if offset is not None:
            self.shared.add(self.clock, offset)

    async def _serve_timed(self, req: _Request) -> None:
        timeout = self.settings.request_timeout
        try:
            async with asyncio.timeout(timeout):
                await self._answer(req)
        except ReasonerError as exc:
            self._fail(req, exc.code, exc.message)
            return
        except TimeoutError:
            self._fail(req, "timeout", f"the background request took longer than {timeout:g} s and was "
                       "stopped; ask something smaller or raise the request timeout")
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not stall the session: report it and go on
            log.exception("background request %s failed", req.id)
            self._fail(req, "internal_error", f"the background worker failed: {type(exc).__name__}: {exc}")
            return
        text = "".join(req.text)
        if text and req.context is not None:
            self.context.commit(req.context, text)
        self._push(req, done=True)
        self._count("completed")
        self._emit("duplex.background.done", request_id=req.id, epoch=req.epoch, status="completed",
                   text=text)
        if text:
            self.session.log.add(self.session.tick * TICK_SECONDS, "background", text, kind="background")

    def unfinished_requests(self) -> list[_Request]:
        """The running request, then those waiting: what a session's snapshot carries to another
        replica, which asks them again (server/_continuity.py)."""
        return ([self._current] if self._current is not None else []) + list(self._waiting)

    def _unfinished(self) -> list[_Request]:
        """The waiting requests and the running one."""
        return list(self._waiting) + ([self._current] if self._current is not None else [])

    def _count(self, status: str) -> None:
        if self.metrics is not None:
            self.metrics.background_requests.labels(status).inc()

    def _fail(self, req: _Request, code: str, message: str) -> None:
        log.warning("background request %s (session %s) failed: %s", req.id, self.session.id, message)
        self._count(code)
        self._push(req, done=True, error=message)
        self._emit("duplex.background.error", request_id=req.id, epoch=req.epoch,
                   error={"code": code, "message": message})

    async def _answer(self, req: _Request) -> None:
        """Stream the reasoner, running tool calls between rounds, until it answers without tools."""
        s, cfg = self.session, self.settings
        messages, req.context = self.context.build(s.log, req.config.instructions_for(s.settings), req.query)
        policy = ToolPolicy(req.config.tool_choice_for(s.settings))  # as it stood when the request began
        client, builtin = self._tools(req) if self.reasoner.supports_tools else ([], [])
        if getattr(self.reasoner, "routes_tools", False):
            # A reasoner that routes (the embedded one: models/background/tool_routing.py) pays for the
            # step on every question it is offered tools with: only the client's declared tools, then.
            builtin = []
        for round_no in range(cfg.max_tool_rounds + 1):
            calls: list[ToolCall] = []
            said: list[str] = []
            tools, choice = policy.offer(round_no, client, builtin)
            async with contextlib.aclosing(self.reasoner.stream(messages, tools, choice)) as deltas:
                async for d in deltas:
                    if isinstance(d, TextDelta):
                        if not req.text and self.metrics is not None:
                            self.metrics.background_first_text_seconds.observe(time.monotonic() - req.asked)
                        said.append(d.text)
                        req.text.append(d.text)
                        self._push(req, text=d.text)
                        self._emit("duplex.background.delta", request_id=req.id, epoch=req.epoch,
                                   delta=d.text)
                    elif isinstance(d, ToolCall):
                        calls.append(d)
            calls = policy.allowed(calls, s.id)
            if not calls:
                return
            if round_no == cfg.max_tool_rounds:
                raise ReasonerError("too_many_tool_calls", f"the reasoner still asked for tools after "
                                    f"{cfg.max_tool_rounds} rounds; the request was stopped")
            messages.append({"role": "assistant", "content": "".join(said) or None, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls]})
            for call in calls:
                result = await self._run_tool(req, call)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result.output})

    # -- tools ----------------------------------------------------------------------------------

    def _tools(self, req: _Request) -> tuple[list[ToolSpec], list[ToolSpec]]:
        """The client's declared tools (the request's own, else the session's) and the built-ins, in chat format."""
        client = client_tools_to_chat(req.config.tools_for(self.session.settings))
        names = {t["function"]["name"] for t in client}
        # A client tool with a built-in's name wins: the client declared it on purpose.
        return client, [t for t in BUILTIN_TOOLS if t["function"]["name"] not in names]

    async def _run_tool(self, req: _Request, call: ToolCall) -> ToolResult:
        client_names = {t.get("name") for t in req.config.tools_for(self.session.settings)}
        if call.name in client_names:
            result = await self._client_tools.call(req.id, call, self.settings.tool_timeout)
        elif call.name in BUILTIN_NAMES:
            result = await run_builtin_async(call.name, call.arguments)
        else:
            result = error_result(call.name, "no such tool; use one of the tools offered")
        self._emit("duplex.background.tool", request_id=req.id, epoch=req.epoch, name=call.name,
                   arguments=call.arguments, ok=result.ok, output=result.output)
        return result

    # -- client requests ----------------------------------------------------------------------------

    def _client_request(self, ev: dict[str, Any], eid: str | None) -> None:
        query = ev.get("query")
        if not isinstance(query, str) or not query.strip():
            self._client_error("invalid_query", "duplex.background.request needs a non-empty string 'query'",
                               "query", eid)
            return
        if len(query) > MAX_QUERY_CHARS:
            self._client_error("query_too_long", f"query has {len(query)} characters; the limit is "
                               f"{MAX_QUERY_CHARS}", "query", eid)
            return
        policy: Policy | None = None
        if "policy" in ev:
            try:
                policy = Policy(ev["policy"])
            except ValueError:
                self._client_error("invalid_policy", "policy must be 'supersede' or 'queue', got "
                                   f"{ev['policy']!r}", "policy", eid)
                return
        wait = self._client_rate.take()
        if wait:
            self._client_error("rate_limited", f"too many background requests from this session; the next one "
                               f"in {retry_after(wait)} s (the reasoner is shared)", "type", eid)
            return
        self.request(query, source="client", policy=policy, client_event_id=eid)

    # -- output -------------------------------------------------------------------------------------

    def _push(self, req: _Request, text: str = "", done: bool = False, error: str | None = None) -> None:
        """Queue a chunk for the next micro-turn; text of one request merges until the engine drains it."""
        if req.epoch < self.floor:
            return  # stale: superseded while it was still streaming
        due = self.clock.due() if self._clocked is req else 0
        last_due, last = self._pending[-1] if self._pending else (0, None)
        if (text and not done and error is None and last is not None and last.request_id == req.id
                and not last.done and last.error is None and last_due == due):
            last.text += text
            return
        self._pending.append((due, BackgroundChunk(req.id, req.epoch, text, done, error, req.ask)))

    def _emit(self, etype: str, **fields: Any) -> None:
        self.session.emit({"type": etype, "event_id": p.new_id("event"), **fields})

    def _client_error(self, code: str, message: str, param: str | None, eid: str | None) -> None:
        self.session.emit(p.error_event(code, message, param, eid))
