"""What a media-pace micro-turn waits for besides its input: the background reasoner reaching the
session's virtual time, and the off-thread work its step uses. Media pace runs as fast as the model
allows, so without these waits it would see answers later (in micro-turns) than real time would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from models.base import SessionState
from server.sessions import Session

PendingWork = Callable[[SessionState], Iterable[Future[Any]]]


class MediaGate:
    """`ready(session)` says whether its next media-pace tick may be stepped now; when not, `wake` is
    called once what it waits for is done."""

    def __init__(self, pending_work: PendingWork | None, wake: Callable[[], None]) -> None:
        self._pending_work = pending_work  # the model's `OffThreadWork`, when it has any
        self._wake = wake
        self._hooked: set[int] = set()  # off-thread work whose completion will wake the media loop

    def ready(self, s: Session) -> bool:
        return self._background_caught_up(s) and self._work_done(s)

    def _background_caught_up(self, s: Session) -> bool:
        """A media-pace tick waits until the session's background request has run as long, in wall
        time, as it would have by that tick in real time (the session's virtual clock)."""
        wait = s.background.media_wait(s.tick)
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self._wake)
            return False
        return True

    def _work_done(self, s: Session) -> bool:
        """A media-pace tick waits until the off-thread work its step uses is done (`OffThreadWork`),
        so the step never falls back to a cheaper answer than it would have had in real time."""
        if self._pending_work is None:
            return True
        waiting = [f for f in self._pending_work(s.state) if not f.done()]
        if not waiting:
            return True
        loop = asyncio.get_running_loop()

        def woken(done: Future[Any]) -> None:  # on the worker's thread
            with contextlib.suppress(RuntimeError):  # the loop closed (server shut down) first
                loop.call_soon_threadsafe(self._woken, id(done))

        for f in waiting:
            if id(f) not in self._hooked:  # one wake-up per piece of work, however often we look
                self._hooked.add(id(f))
                f.add_done_callback(woken)
        return False

    def _woken(self, key: int) -> None:
        self._hooked.discard(key)
        self._wake()
