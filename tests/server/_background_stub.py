"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1: the network boundary of the
background reasoner's tests.

It speaks real HTTP/1.1 with chunked SSE, so the `openai` client library parses it exactly as it
parses a real server. The script is picked by a marker in the last user message:

  [tool:NAME:JSON]  first call answers with a tool call NAME(JSON); once a tool result is in the
                    history it answers "tool said: <result>"
  [slow]            ten words, 50 ms apart
  [hang]            headers, then silence (read timeout)
  [drop]            two words, then the connection is cut mid-body
  [malformed]       one word, then a `data:` line that is not JSON
  anything else     "answer: <the task>" word by word, or `answer` word by word where one was given
                    (a look-up's result, whatever words the recogniser heard in the request)

Before the script, the request's `tool_choice` is obeyed as a real server obeys it (unless
`obey_tool_choice` is False): "none" answers in words whatever the marker says, "required" calls the
first tool offered and {"type": "function", "function": {"name": X}} calls X (with the marker's
arguments when the marker names X, else `{}`), each only while no tool result is in the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from typing import Any

_TOOL = re.compile(r"\[tool:(\w+):(\{.*?\})\]")


class ScriptedOpenAI:
    def __init__(self, answer: str | None = None) -> None:
        self.answer = answer
        self.obey_tool_choice = True  # False: a server that calls tools whatever `tool_choice` says
        self.requests: list[dict[str, Any]] = []  # request bodies, in arrival order
        self.cut_connections = 0  # connections the client closed while we were still streaming
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="scripted-openai", daemon=True)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedOpenAI:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop)
        self._server = fut.result(5)
        self._closing = asyncio.run_coroutine_threadsafe(self._make_event(), self._loop).result(5)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._closing.set()  # ends [hang] scripts
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    @staticmethod
    async def _make_event() -> asyncio.Event:
        return asyncio.Event()  # created on the stub's own loop

    # -- HTTP ---------------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._handlers.add(me)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
            body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
            self.requests.append(body)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            await self._script(body, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            self.cut_connections += 1
        except asyncio.CancelledError:
            pass  # the stub is stopping: end quietly
        finally:
            self._handlers.discard(me)
            with contextlib.suppress(Exception):
                writer.close()

    async def _script(self, body: dict[str, Any], w: asyncio.StreamWriter) -> None:
        messages = body["messages"]
        task = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        tool_results = [m for m in messages if m["role"] == "tool"]
        tool = _TOOL.search(task)
        choice = body.get("tool_choice", "auto") if self.obey_tool_choice else "auto"
        forced = body["tools"][0]["function"]["name"] if choice == "required" else \
            choice["function"]["name"] if isinstance(choice, dict) else None
        if choice == "none":
            await self._words(w, ("answer: " + _TOOL.sub("", task).strip()).split(" "))
        elif forced is not None and not tool_results:
            await self._tool_call(w, forced, tool.group(2) if tool and tool.group(1) == forced else "{}")
        elif tool and not tool_results:
            await self._tool_call(w, tool.group(1), tool.group(2))
        elif tool:
            await self._words(w, f"tool said: {tool_results[-1]['content']}".split(" "))
        elif "[slow]" in task:
            await self._words(w, [f"slow{i}" for i in range(10)], delay=0.05)
        elif "[hang]" in task:
            await w.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), 30)
        elif "[drop]" in task:
            await self._words(w, ["cut", "here"], finish=False)
            w.transport.abort()  # mid-body: the chunked encoding is left unterminated
        elif "[malformed]" in task:
            await self._words(w, ["broken"], finish=False)
            await self._send(w, "data: {this is not json\n\n")
            await self._end(w)
        elif self.answer is not None:
            await self._words(w, self.answer.split(" "))
        else:
            await self._words(w, ("answer: " + task.split("Task:")[-1].strip()).split(" "))

    async def _words(self, w: asyncio.StreamWriter, words: list[str], delay: float = 0.0,
                     finish: bool = True) -> None:
        for i, word in enumerate(words):
            await self._chunk(w, {"content": word if i == 0 else " " + word})
            if delay:
                await asyncio.sleep(delay)
        if finish:
            await self._chunk(w, {}, finish="stop")
            await self._send(w, "data: [DONE]\n\n")
            await self._end(w)

    async def _tool_call(self, w: asyncio.StreamWriter, name: str, arguments: str) -> None:
        half = len(arguments) // 2  # arguments arrive in two fragments, as real servers send them
        await self._chunk(w, {"tool_calls": [{"index": 0, "id": "call_model_1", "type": "function",
                                              "function": {"name": name, "arguments": arguments[:half]}}]})
        await self._chunk(w, {"tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]})
        await self._chunk(w, {}, finish="tool_calls")
        await self._send(w, "data: [DONE]\n\n")
        await self._end(w)

    async def _chunk(self, w: asyncio.StreamWriter, delta: dict[str, Any], finish: str | None = None) -> None:
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()),
                 "model": "scripted", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        await self._send(w, "data: " + json.dumps(chunk) + "\n\n")

    async def _send(self, w: asyncio.StreamWriter, text: str) -> None:
        data = text.encode()
        w.write(b"%x\r\n%s\r\n" % (len(data), data))
        await w.drain()

    async def _end(self, w: asyncio.StreamWriter) -> None:
        w.write(b"0\r\n\r\n")
        await w.drain()
