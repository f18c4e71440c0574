"""The threads that decode client pictures: a few of their own, one picture per session, a bounded queue.

Decoding a picture is the dearest thing a client can ask for per byte it sends, so it never runs on
the event loop's default executor (aiortc encodes every WebRTC call's audio there: pictures queued in
it would stall every call). Here at most `workers` pictures are decoded at once in the whole process,
at most `queued` more wait, and a session has at most one picture in the pool: a picture beyond these
is refused at once (`server_busy`, `picture_in_flight`) instead of waiting, so the cost of pictures to
the rest of the server is bounded by `workers` cores whatever the clients send.

A picture counts until its thread is done with it, not until its caller stops waiting: a client that
disconnects mid-decode does not free its place early (a picture still queued is dropped then).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class PoolFull(Exception):
    """A picture refused before it was queued; `code` names why (an error event's code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class PicturePool:
    """`run(owner, fn, *args)`: fn(*args) on one of this pool's threads, or PoolFull at once."""

    def __init__(self, workers: int, queued: int) -> None:
        if workers < 1 or queued < 0:
            raise ValueError(f"a picture pool needs workers >= 1 and queued >= 0, got {workers}, {queued}")
        self.workers, self.queued = workers, queued
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="picture", initializer=_yield_to_others)
        self._lock = threading.Lock()  # done callbacks run on the pool's threads; servers on several loops share it
        self._owners: set[Hashable] = set()  # one entry per picture in the pool (running or waiting)

    @property
    def taken(self) -> int:
        """Pictures in the pool now: being decoded or waiting for a thread."""
        with self._lock:
            return len(self._owners)

    async def run(self, owner: Hashable, fn: Callable[..., T], *args: object) -> T:
        with self._lock:
            if owner in self._owners:
                raise PoolFull("picture_in_flight", "this session's previous picture is still being decoded; "
                               "send the next one after it is answered")
            if len(self._owners) >= self.workers + self.queued:
                raise PoolFull("server_busy", "the server is decoding as many pictures as it takes; this one was "
                               "dropped, send it again later")
            self._owners.add(owner)
        try:
            job: Future[T] = self._executor.submit(fn, *args)
        except BaseException:
            self._release(owner)
            raise
        job.add_done_callback(lambda _: self._release(owner))
        return await asyncio.wrap_future(job)  # cancelling the wait cancels the job only if it has not started

    def _release(self, owner: Hashable) -> None:
        with self._lock:
            self._owners.discard(owner)


PICTURE_NICENESS = 10  # added to the decode threads' nice value: under load, the ticks run first


def _yield_to_others() -> None:
    """Lower this decode thread's CPU priority, so a busy machine runs the event loop and the model's
    threads before it (Linux schedules threads one by one; elsewhere the call would renice the process)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                           os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + PICTURE_NICENESS)


def default_workers() -> int:
    """A quarter of the cores, 1 to 4: pictures never take more of the machine than that."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


_shared: PicturePool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> PicturePool:
    """The process's pool (made on first use: its threads start only when pictures arrive)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            workers = default_workers()
            _shared = PicturePool(workers, queued=4 * workers)
        return _shared
