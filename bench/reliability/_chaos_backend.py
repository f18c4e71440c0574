"""A scripted OpenAI-compatible chat-completions backend for bench.reliability.chaos, run as its own process.

    python -m bench.reliability._chaos_backend PORT

Its own process so that bench.reliability.chaos can really kill it (SIGKILL) in the middle of a stream. It
speaks HTTP/1.1 with chunked server-sent events, as OpenAI-compatible servers do. The script is
chosen by a marker anywhere in the last user message:

  [long]     100 words, 100 ms apart (a stream to kill in the middle)
  [slow]     40 words, 500 ms apart (longer than the duplex server's background timeout)
  [garbage]  two words, then lines that are not JSON, not SSE and not UTF-8, then a clean end
  otherwise  "answer: ok" at once
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
        body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
        task = next((str(m.get("content")) for m in reversed(body.get("messages", [])) if m.get("role") == "user"),
                    "")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        if "[long]" in task:
            await _words(writer, [f"long{i}" for i in range(100)], 0.1)
        elif "[slow]" in task:
            await _words(writer, [f"slow{i}" for i in range(40)], 0.5)
        elif "[garbage]" in task:
            await _words(writer, ["before", "garbage"], 0.05, finish=False)
            for junk in (b"data: {this is not json\n\n", b"\xff\xfe\x00 not utf-8 \x80\n\n", b"event: ???\n\n",
                         b'data: {"choices": "not a list"}\n\n', b"data: [1, 2, 3]\n\n"):
                await _send(writer, junk)
            await _words(writer, ["after"], 0.0)
        else:
            await _words(writer, ["answer:", "ok"], 0.0)
    except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ValueError):
        pass  # the client went away (or sent no request): nothing to answer
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _words(w: asyncio.StreamWriter, words: list[str], delay: float, finish: bool = True) -> None:
    for i, word in enumerate(words):
        await _chunk(w, {"content": word if i == 0 else " " + word})
        if delay:
            await asyncio.sleep(delay)
    if finish:
        await _chunk(w, {}, finish="stop")
        await _send(w, b"data: [DONE]\n\n")
        w.write(b"0\r\n\r\n")
        await w.drain()


async def _chunk(w: asyncio.StreamWriter, delta: dict[str, Any], finish: str | None = None) -> None:
    chunk = {"id": "chatcmpl-chaos", "object": "chat.completion.chunk", "created": int(time.time()),
             "model": "scripted", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    await _send(w, ("data: " + json.dumps(chunk) + "\n\n").encode())


async def _send(w: asyncio.StreamWriter, data: bytes) -> None:
    w.write(b"%x\r\n%s\r\n" % (len(data), data))
    await w.drain()


async def main(port: int) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
