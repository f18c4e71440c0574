"""The cascade's worker pools: warm-up reaches every thread of a pool (each has a heap arena of its own)."""

from __future__ import annotations

import threading
import time

from models.cascade.work import Workers


def test_on_every_thread_runs_once_on_each_thread_at_the_same_time() -> None:
    workers = Workers({"a": 3, "b": 1})
    seen: list[str] = []
    lock = threading.Lock()
    inside = 0
    most_inside = 0

    def call() -> None:
        nonlocal inside, most_inside
        with lock:
            inside += 1
            most_inside = max(most_inside, inside)
            seen.append(threading.current_thread().name)
        time.sleep(0.05)
        with lock:
            inside -= 1

    try:
        workers.on_every_thread("a", call)
        assert len(seen) == 3 and len(set(seen)) == 3, seen  # one call per thread, none twice
        assert all(name.startswith("cascade-a") for name in seen), seen
        assert most_inside == 3  # all at once: no thread could take a second call
        seen.clear()
        workers.on_every_thread("b", call)
        assert len(seen) == 1 and seen[0].startswith("cascade-b")
    finally:
        workers.close()
