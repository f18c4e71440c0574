"""The runtime's housekeeping loop: the event loop's lag, reaping, the session store's upkeep, and
garbage collection, each on its own period."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable

from models import heap
from server.metrics import Metrics

log = logging.getLogger(__name__)

REAP_EVERY = 1.0  # seconds between reaps of idle and expired sessions
LAG_PROBE = 0.1  # seconds between event-loop lag probes (duplex_event_loop_lag_seconds)
# The session store: a lease lasts LEASE_S and is renewed every STORE_SYNC, when changed snapshots are
# written too. A replica killed with -9 stops renewing; its sessions can be claimed LEASE_S later.
LEASE_S = 1.5
STORE_SYNC = 0.4


async def upkeep_forever(metrics: Metrics, collect_every: float, reap: Callable[[float], Awaitable[object]],
                         sync_store: Callable[[], Awaitable[None]] | None) -> None:
    """Every LAG_PROBE s measure how late the loop woke us; every STORE_SYNC s `sync_store` (when the
    server has a store); every REAP_EVERY s `reap`; every `collect_every` s (server/limits.py:
    COLLECT_EVERY) collect garbage and trim the heap."""
    collected = reaped = synced = time.monotonic()
    while True:
        due = time.monotonic() + LAG_PROBE
        await asyncio.sleep(LAG_PROBE)
        now = time.monotonic()
        # A late wake-up is time the loop spent on something else: a slow handler or a pause delays
        # every client's bytes even when the engine keeps its deadlines (the tick thread is separate).
        metrics.loop_lag_seconds.observe(max(0.0, now - due))
        if sync_store is not None and now - synced >= STORE_SYNC:
            synced = now
            try:
                await sync_store()
            except Exception:  # the store's upkeep must never stop the reaper
                log.exception("session store upkeep failed")
        if now - reaped < REAP_EVERY:
            continue
        reaped = now
        try:
            await reap(time.monotonic())
        except Exception:  # reaping must never stop; log and go on
            log.exception("session reaper failed")
        if time.monotonic() - collected >= collect_every:
            started = time.monotonic()
            gc.collect()
            metrics.loop_lag_seconds.observe(time.monotonic() - started)  # the loop waited on it too
            # What the collection (and the model's worker threads) freed goes back to the OS, off
            # the loop: a trim walks every heap arena (models/heap.py).
            await asyncio.to_thread(heap.trim)
            collected = time.monotonic()
