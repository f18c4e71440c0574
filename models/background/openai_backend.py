"""Any OpenAI-compatible chat-completions server with streaming: SGLang, vLLM, llama.cpp's server,
hosted APIs.

The `openai` client library speaks HTTP and SSE; this module only maps its chunks onto our deltas and
its failures onto `ReasonerError` with a message that says what to do. Retries are ours, not the
library's: a request is retried (with backoff) only while nothing has been streamed yet, so a retry
can never duplicate text the conversation already heard.

Multi-GPU / multi-node: run SGLang as a server (tensor parallel inside it, a router in front of
several) and point this backend at it; models/background/sglang_backend.py shows the commands and
how SGLang's streaming sessions keep a conversation's KV cache between requests.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from models.background.base import Delta, Done, Message, ReasonerError, TextDelta, ToolCall, ToolChoice, ToolSpec

log = logging.getLogger(__name__)

API_KEY_ENV = "DUPLEX_BACKGROUND_API_KEY"  # falls back to OPENAI_API_KEY; local servers need none


@dataclass
class OpenAIConfig:
    base_url: str  # e.g. http://127.0.0.1:30000/v1
    model: str = "default"  # SGLang and llama.cpp's server accept any name for their one model
    api_key_env: str = API_KEY_ENV
    api_key: str | None = None  # the key itself (a child server's own); else read from `api_key_env`
    connect_timeout: float = 5.0  # s to open the connection
    read_timeout: float = 30.0  # s of silence between two streamed bytes before giving up
    retries: int = 2  # extra attempts while nothing has been streamed yet
    backoff: float = 0.25  # s before the first retry, doubled each time
    max_tokens: int = 512
    temperature: float = 0.3
    extra_body: dict[str, Any] = field(default_factory=dict)  # backend-specific fields (e.g. SGLang session)
    trust_env: bool = True  # False: ignore proxy settings of the environment (a server on loopback)
    # False: a connection per request. llama-server closes a connection after a streamed answer, and the
    # next request on it from the pool failed ("Server disconnected without sending a response").
    keepalive: bool = True


def _api_key(env: str) -> str:
    # The library refuses an empty key; servers without auth ignore whatever we send.
    return os.environ.get(env) or os.environ.get("OPENAI_API_KEY") or "not-needed"


class OpenAIReasoner:
    supports_tools = True

    def __init__(self, config: OpenAIConfig) -> None:
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - a project dependency
            raise ReasonerError("missing_dependency", f"the openai backend needs the 'openai' package ({exc}); "
                                "install it with `pip install openai`") from exc
        self.config = config
        self.name = f"openai:{config.model}@{config.base_url}"
        self._openai = openai
        # openai.Timeout is the HTTP library's own timeout type (whichever httpx the library ships with).
        timeout = openai.Timeout(config.read_timeout, connect=config.connect_timeout)
        http = None
        if not (config.trust_env and config.keepalive):
            # The HTTP library the client is built on (httpx, or httpx2 in later openai releases).
            lib = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])
            limits = lib.Limits(max_connections=1000, max_keepalive_connections=100 if config.keepalive else 0)
            http = openai.DefaultAsyncHttpxClient(trust_env=config.trust_env, timeout=timeout, limits=limits)
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url, api_key=config.api_key or _api_key(config.api_key_env), timeout=timeout,
            max_retries=0,
            http_client=http,
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def stream(self, messages: list[Message], tools: list[ToolSpec],
                     tool_choice: ToolChoice = "auto") -> AsyncGenerator[Delta, None]:
        cfg = self.config
        attempt = 0
        while True:
            streamed = False
            try:
                async for delta in self._one_attempt(messages, tools, tool_choice):
                    streamed = True
                    yield delta
                return
            except ReasonerError as exc:
                retryable = exc.code in ("unreachable", "timeout", "server_error", "rate_limited")
                if streamed or not retryable or attempt >= cfg.retries:
                    raise
                delay = cfg.backoff * (2**attempt)
                attempt += 1
                log.warning(
                    "background reasoner %s failed (%s); retry %d/%d in %.2fs",
                    self.name,
                    exc.message,
                    attempt,
                    cfg.retries,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _one_attempt(self, messages: list[Message], tools: list[ToolSpec],
                           tool_choice: ToolChoice) -> AsyncGenerator[Delta, None]:
        async for delta in self.stream_once(messages, tools, tool_choice=tool_choice):
            yield delta

    async def stream_once(self, messages: list[Message], tools: list[ToolSpec],
                          extra_body: dict[str, Any] | None = None,
                          observe: Callable[[Any], None] | None = None,
                          tool_choice: ToolChoice = "auto") -> AsyncGenerator[Delta, None]:
        """One attempt, no retry. `extra_body`: fields for this request on top of the config's (e.g.
        llama-server's `id_slot`); `observe`: called with every raw chunk (e.g. to read its `timings`);
        `tool_choice`: sent with the tools (the API refuses it without any), left out when "auto"."""
        cfg, oa = self.config, self._openai
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "messages": messages,
            "stream": True,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
        }
        if tools:
            kwargs["tools"] = tools
            if tool_choice != "auto":
                kwargs["tool_choice"] = tool_choice
        if cfg.extra_body or extra_body:
            kwargs["extra_body"] = {**cfg.extra_body, **(extra_body or {})}
        where = f"{cfg.base_url} (model {cfg.model})"
        opened = False  # the server answered 200 and started streaming
        try:
            stream = await self._client.chat.completions.create(**kwargs)
            opened = True
            try:
                async for delta in _deltas(stream, observe):
                    yield delta
            finally:
                await stream.close()
        except ReasonerError:
            raise
        except oa.APITimeoutError:
            raise ReasonerError(
                "timeout",
                f"background reasoner at {where} sent nothing for "
                f"{cfg.read_timeout:g} s; check that it is not overloaded, or raise the "
                "read timeout",
            ) from None
        except oa.APIConnectionError as exc:
            if opened:
                raise ReasonerError("dropped", f"background reasoner at {where} dropped the connection "
                                    f"mid-answer ({_short(str(exc.__cause__ or exc))})") from None
            raise ReasonerError(
                "unreachable",
                f"cannot reach the background reasoner at {where}: "
                f"{exc.__cause__ or exc}; start it or fix --background-url",
            ) from None
        except oa.RateLimitError:
            raise ReasonerError(
                "rate_limited",
                f"background reasoner at {where} is rate limiting; slow down or raise its limits",
            ) from None
        except oa.AuthenticationError:
            raise ReasonerError(
                "unauthorized",
                f"background reasoner at {where} refused the API key; set "
                f"{cfg.api_key_env} (or OPENAI_API_KEY)",
            ) from None
        except oa.APIStatusError as exc:
            code = "server_error" if exc.status_code >= 500 else "bad_request"
            raise ReasonerError(
                code, f"background reasoner at {where} answered HTTP {exc.status_code}: {_short(exc.message)}"
            ) from None
        except oa.APIError as exc:  # an error object inside the stream
            raise ReasonerError(
                "server_error",
                f"background reasoner at {where} reported an error mid-stream: {_short(str(exc))}",
            ) from None
        except (json.JSONDecodeError, AttributeError, TypeError, KeyError, IndexError) as exc:
            raise ReasonerError(
                "malformed",
                f"background reasoner at {where} sent a malformed stream chunk "
                f"({type(exc).__name__}: {_short(str(exc))}); is it really OpenAI-compatible?",
            ) from None
        except Exception as exc:  # a transport error the library did not wrap
            stage = "mid-answer" if opened else "before answering"
            raise ReasonerError("dropped" if opened else "unreachable", f"background reasoner at {where} failed "
                                f"{stage} ({type(exc).__name__}: {_short(str(exc))})") from None

    async def complete_json(self, messages: list[Message], schema: dict[str, Any],
                            extra_body: dict[str, Any] | None = None, max_tokens: int = 96,
                            observe: Callable[[Any], None] | None = None) -> str:
        """One non-streamed, greedy completion constrained to the JSON `schema` (`response_format`
        json_schema: llama-server compiles it to a grammar); its text. No retry. `observe`: called with
        the raw response (e.g. to read its `timings`)."""
        cfg, oa = self.config, self._openai
        kwargs: dict[str, Any] = {
            "model": cfg.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "choice", "schema": schema}},
        }
        if cfg.extra_body or extra_body:
            kwargs["extra_body"] = {**cfg.extra_body, **(extra_body or {})}
        where = f"{cfg.base_url} (model {cfg.model})"
        try:
            resp = await self._client.chat.completions.create(**kwargs)
        except oa.APITimeoutError:
            raise ReasonerError("timeout", f"background reasoner at {where} sent nothing for "
                                f"{cfg.read_timeout:g} s") from None
        except oa.APIConnectionError as exc:
            raise ReasonerError("unreachable", f"cannot reach the background reasoner at {where}: "
                                f"{_short(str(exc.__cause__ or exc))}") from None
        except oa.APIStatusError as exc:
            code = "server_error" if exc.status_code >= 500 else "bad_request"
            raise ReasonerError(code, f"background reasoner at {where} answered HTTP {exc.status_code}: "
                                f"{_short(exc.message)}") from None
        except oa.APIError as exc:
            raise ReasonerError("server_error", f"background reasoner at {where} failed: {_short(str(exc))}") from None
        if observe is not None:
            observe(resp)
        if not resp.choices:
            raise ReasonerError("malformed", f"background reasoner at {where} answered without a choice")
        return resp.choices[0].message.content or ""


async def _deltas(stream: Any, observe: Callable[[Any], None] | None = None) -> AsyncGenerator[Delta, None]:
    """Map chat-completion chunks onto deltas; tool-call fragments are joined by their index."""
    calls: dict[int, dict[str, str]] = {}  # index -> {"id", "name", "arguments"}
    finish = ""
    tokens = 0
    async for chunk in stream:
        if observe is not None:
            observe(chunk)
        if chunk.usage is not None and chunk.usage.completion_tokens:
            tokens = chunk.usage.completion_tokens
        if not chunk.choices:  # usage-only chunk at the end
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta is not None:
            if delta.content:
                yield TextDelta(delta.content)
            for tc in delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function is not None:
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
        if choice.finish_reason:
            finish = choice.finish_reason
    if not finish:
        raise ReasonerError(
            "dropped",
            "the background reasoner's stream ended without a finish_reason (connection cut mid-answer?)",
        )
    for i in sorted(calls):
        c = calls[i]
        if not c["name"]:
            raise ReasonerError(
                "malformed", f"tool call #{i} in the background reasoner's stream has no function name"
            )
        yield ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"])
    yield Done(finish, tokens)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
