"""bench.soak: a 30-second soak of an echo server with clients coming, dropping, resuming and leaving.

The 30-minute figures (RSS slope per 10 minutes after warm-up) are in the closing note; a short run's
slope is noise, so this checks what 30 s can show (kept short: the three reliability tests together
stay well under two minutes of CI): no missed deadline, no lost echo, every resume
working, descriptors and threads back at their start values, nothing in the server's log.
"""

from __future__ import annotations

import pytest

from bench import soak
from bench._reliability import ServerUnderTest, fit_slope


def test_fit_slope() -> None:
    assert fit_slope([0, 1, 2, 3], [5, 7, 9, 11]) == pytest.approx(2.0)
    assert fit_slope([0, 1], [0, 1]) is None  # too few points


def test_short_soak_of_echo() -> None:
    with ServerUnderTest("--model", "echo", "--background", "none", "--log-level", "warning") as server:
        r = soak.soak(server, "echo", sessions=4, minutes=0.5, seed=3, churn=3.0, every=2.0, warmup=8.0,
                      max_rss_slope=float("inf"))
    summary = soak.summary(r)
    assert r.leaves > 0 and r.drops > 0 and r.resumes_ok > 0, f"the churn did not happen: {summary}"
    assert r.chunks_sent > 4 * 100 and r.echoes_returned > 0, summary
    assert r.missed_deadlines == 0, summary
    assert r.echoes_missed == 0 and r.echoes_late == 0, summary
    assert r.resumes_failed == 0 and r.untold_closes == 0, summary
    assert r.fds_end <= r.fds_start, summary
    assert r.tasks_start > 0 and r.tasks_end == r.tasks_start, summary
    assert r.threads_end <= max(r.threads_start, r.threads_after_warmup), summary
    assert not r.faults and not r.server_errors, summary
    assert len(r.samples) >= 12
