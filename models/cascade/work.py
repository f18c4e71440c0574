"""Off-thread work whose result is used at a fixed micro-turn: the same in media and real-time pace.

The cascade's slow parts (Smart Turn, Whisper) run on worker threads that release the GIL
(onnxruntime, CTranslate2), so the tick thread only submits and collects. If results were used "as
soon as they are done", a media-pace run (ticks flat out) would see them at other micro-turns than a
real-time run, and the two would disagree. Instead each job is *due* a fixed number of micro-turns
after it was submitted: at that micro-turn the tick takes the result, waiting for it if the worker
is late (in real time that wait only happens when the machine cannot do the work within its budget,
and costs that tick's deadline, which the engine counts). A job that fails or overruns `timeout`
gives `None`; callers fall back to a cheaper answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass
class Job(Generic[T]):
    future: Future[T]
    due: int  # the session's micro-turn (CascadeState.ticks) at which the result is used
    name: str = ""  # the worker it runs on (for the overrun warning)

    def take(self, tick: int, timeout: float) -> tuple[bool, T | None]:
        """(due now or overdue, result or None on failure). Not due yet: (False, None)."""
        if tick < self.due:
            return False, None
        try:
            return True, self.future.result(timeout=timeout)
        except FutureTimeout:
            log.warning("%s job missed its budget by more than %.1f s; using the fallback", self.name, timeout)
            self.future.cancel()
            return True, None
        except Exception as e:  # a failed classifier/transcriber must not stop the session
            log.warning("off-thread job failed (%s: %s); using the fallback", type(e).__name__, e)
            return True, None


class Workers:
    """Named thread pools (name -> threads), started with the model and stopped by `close`."""

    def __init__(self, threads: dict[str, int]) -> None:
        self._pools = {
            n: ThreadPoolExecutor(max_workers=k, thread_name_prefix=f"cascade-{n}") for n, k in threads.items()
        }

    def submit(self, name: str, due: int, fn: Callable[..., T], *args: object) -> Job[T]:
        return Job(self._pools[name].submit(fn, *args), due, name)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
