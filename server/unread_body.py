"""An HTTP answer goes out only after the request's body is in, up to a bound.

A request refused before its body is read (401 before the key's endpoint reads anything, 413 for an
offer declared too long, 415 for the wrong type) is answered, and uvicorn then closes a connection
whose body was never read. Closing a socket with unread bytes makes the kernel send a reset, and the
reset can reach the client before the client has read the answer: the client sees "connection reset"
instead of the refusal that says what to fix (the fuzzer's http target and a test saw it under load).
So before an answer starts, whatever is left of the body is read and dropped, up to `DRAIN_BYTES`;
past that the answer goes out anyway (a client sending megabytes it was told not to send may get the
reset). The answer's wait is the body's own transfer time: the client is sending it anyway.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.limits import DRAIN_BYTES


class ReadBodyBeforeAnswer:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        pending = True  # more of the body may come (the app has not seen its end)

        async def tracked_receive() -> Message:
            nonlocal pending
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                pending = False
            return message

        async def drained_send(message: Message) -> None:
            nonlocal pending
            if message["type"] == "http.response.start" and pending:
                read = 0
                while pending and read <= DRAIN_BYTES:
                    got = await receive()
                    read += len(got.get("body", b""))
                    pending = got["type"] == "http.request" and bool(got.get("more_body", False))
                pending = False
            await send(message)

        await self.app(scope, tracked_receive, drained_send)
