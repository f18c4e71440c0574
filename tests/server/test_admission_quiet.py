"""Admission measures the step when the process is quiet: a model's start-up work on a thread of its own
(the native talker pre-rendering its phrases) is waited out before the calibration's steps are timed."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

import pytest

from server.admission import quiet

pytestmark = pytest.mark.serial  # it measures how busy the process's other threads are: run alone (Makefile, test)


def _burn(seconds: float) -> None:
    """CPU work that, like a model's kernels, runs outside the GIL (hashing a large buffer releases it),
    so the sampler is not starved by the test's own thread holding the interpreter."""
    block, end = bytes(1 << 20), time.monotonic() + seconds
    while time.monotonic() < end:
        hashlib.sha256(block).digest()


def test_calibration_waits_for_start_up_work_on_other_threads_to_finish() -> None:
    work = threading.Thread(target=_burn, args=(2.0,), daemon=True)
    t0 = time.monotonic()
    work.start()
    waited, used = asyncio.run(quiet(window=0.25, limit=20.0))
    assert not work.is_alive(), f"measured while start-up work still ran ({waited:.2f} s, busy {used:.0%})"
    assert waited < 5.0 and used < 0.2, (waited, used)
    # Nothing running: no wait beyond one window.
    waited, _ = asyncio.run(quiet(window=0.25, limit=20.0))
    assert waited < 1.0, waited
    assert time.monotonic() - t0 < 10


def test_a_process_that_stays_busy_is_measured_after_the_limit() -> None:
    work = threading.Thread(target=_burn, args=(3.0,), daemon=True)
    work.start()
    waited, used = asyncio.run(quiet(window=0.25, limit=1.0))
    assert 1.0 <= waited < 2.5 and used >= 0.2, (waited, used)
    work.join()
