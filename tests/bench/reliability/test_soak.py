"""bench.reliability.soak: the 60-second soak CI runs, an echo server with clients coming, dropping,
resuming and leaving.

The 30-minute figures (RSS slope per 10 minutes after warm-up) are in the closing notes; a short run's
slope is noise, so this checks what a minute can show: no missed deadline, no lost echo, every resume
working, descriptors and threads back at their start values, nothing in the server's log.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench._server import ServerUnderTest
from bench.reliability import soak
from bench.reliability._common import LoopLag, fit_line, fit_slope


def test_fit_slope() -> None:
    assert fit_slope([0, 1, 2, 3], [5, 7, 9, 11]) == pytest.approx(2.0)
    assert fit_slope([0, 1], [0, 1]) is None  # too few points
    assert fit_line([0, 1, 2, 3], [5, 7, 9, 11]) == pytest.approx((2.0, 0.0))
    # Residuals +-1 around a flat line: se = sqrt(sum r^2 / (n - 2) / sum (t - mean)^2) = sqrt(4 / 2 / 5).
    assert fit_line([0, 1, 2, 3], [1, -1, -1, 1]) == pytest.approx((0.0, (4 / 2 / 5) ** 0.5))


def test_rss_slopes_are_fitted_to_the_dense_series_and_its_per_minute_floor() -> None:
    """A flat resident floor with bursts of working memory (as a Whisper call makes) on top: the least-
    squares slope of the dense series is what is judged, the floor's slope is reported beside it, and a
    burst-free rise is seen by both."""
    rng = np.random.default_rng(0)
    t = np.arange(0.0, 1800.0, 1.0)
    bursts = np.where(rng.random(t.size) < 0.05, rng.uniform(50, 250, t.size), 0.0)
    r = soak.SoakReport(model="cascade", sessions=1, minutes=30, seed=1, capacity=1)
    r.rss_series = [(float(x), 900.0 + float(b)) for x, b in zip(t, bursts, strict=True)]
    soak._fit_rss(r, warmup=600.0)
    assert r.rss_points == 1200
    assert r.rss_floor_slope_mb_per_10min == pytest.approx(0.0)
    assert r.rss_slope_mb_per_10min is not None and r.rss_slope_se_mb_per_10min is not None
    assert abs(r.rss_slope_mb_per_10min) < 4 * r.rss_slope_se_mb_per_10min  # bursts are noise, not growth
    leak = soak.SoakReport(model="cascade", sessions=1, minutes=30, seed=1, capacity=1)
    leak.rss_series = [(float(x), 900.0 + x / 60) for x in t]  # 10 MB per 10 min
    soak._fit_rss(leak, warmup=600.0)
    assert leak.rss_slope_mb_per_10min == pytest.approx(10.0)
    assert leak.rss_floor_slope_mb_per_10min == pytest.approx(10.0)
    assert leak.rss_slope_second_half_mb_per_10min == pytest.approx(10.0)
    soak._judge(leak, max_rss_slope=1.0)
    assert any("RSS grows 10.0 MB per 10 min" in f for f in leak.failures), leak.failures


@pytest.mark.serial  # it measures lateness and memory over a run: run alone (Makefile, test); the rest is arithmetic
def test_short_soak_of_echo() -> None:
    with ServerUnderTest("--model", "echo", "--background", "none", "--log-level", "warning") as server:
        # 12 s: the suite's budget is 10 minutes; samples every second keep the checks' counts, and seed 3
        # makes every kind of churn happen (4 leaves, 7 drops and resumes measured).
        r = soak.soak(server, "echo", sessions=4, minutes=0.2, seed=3, churn=3.0, every=1.0, warmup=4.0,
                      max_rss_slope=float("inf"))
    summary = soak.summary(r)
    assert r.leaves > 0 and r.drops > 0 and r.resumes_ok > 0, f"the churn did not happen: {summary}"
    assert r.chunks_sent > 150 and r.echoes_returned > 0, summary  # of 4 x 12 s x 5 a second, less the churn
    assert r.missed_deadlines == 0, summary
    # Late echoes are judged as the bench judges them: those the soak client's own loop stalls explain are
    # the client's (it shares two cores with the server), the rest are the server's and must be none.
    assert r.echoes_missed == 0 and r.echoes_late - r.late_while_client_stalled == 0, summary
    assert r.resumes_failed == 0 and r.untold_closes == 0, summary
    assert r.fds_end <= r.fds_start, summary
    assert r.tasks_start > 0 and r.tasks_end == r.tasks_start, summary
    assert r.threads_end <= max(r.threads_start, r.threads_after_warmup), summary
    assert not r.faults and not r.server_errors, summary
    assert len(r.samples) >= 9
    # The RSS-only readings, one a second, are what the slope is fitted to (those after the warm-up).
    assert len(r.rss_series) >= 10 and r.rss_points >= 6 and all(mb > 10 for _, mb in r.rss_series), summary
    assert r.rss_slope_mb_per_10min is not None and r.rss_slope_se_mb_per_10min is not None, summary
    # The server's loop-lag probe ran (10 a second) and the loop never stalled for a micro-turn.
    assert r.server_loop_probes >= 80 and r.server_loop_lag_over_200ms == 0, summary


def test_late_echoes_are_split_between_the_client_loop_and_the_server() -> None:
    lag = LoopLag()
    lag.stalls = [(100.0, 350.0), (300.0, 120.0)]  # (wall time, ms) of the soak client's own loop stalls
    r = soak.SoakReport(model="echo", sessions=1, minutes=1.0, seed=1, capacity=1)
    late = [(100.2, 400.0),  # waited 99.8..100.2 through a 350 ms stall: on time without it (400 - 350 < 200)
            (200.0, 260.0),  # no stall while it waited: the server's
            (300.1, 500.0)]  # a 120 ms stall does not explain 500 ms (still 380 late): the server's
    name = "duplex_event_loop_lag_seconds"
    before = {f"{name}_count": 10.0, f'{name}_bucket{{le="0.1"}}': 10.0, f'{name}_bucket{{le="0.2"}}': 10.0}
    after = {f"{name}_count": 40.0, f'{name}_bucket{{le="0.1"}}': 37.0, f'{name}_bucket{{le="0.2"}}': 39.0}
    soak._attribute_late(r, late, lag, after, before, t_wall0=90.0)
    r.echoes_late = len(late)
    assert r.late_while_client_stalled == 1
    assert r.late_seconds[0] == {"t": 10, "late": 1}
    assert (r.server_loop_probes, r.server_loop_lag_over_100ms, r.server_loop_lag_over_200ms) == (30, 3, 1)
    soak._judge(r, max_rss_slope=1.0)
    assert any("2 late (and 1 late while the soak client" in f for f in r.failures), r.failures


def test_stalls_of_the_clients_loop_add_up_while_an_echo_is_awaited() -> None:
    lag = LoopLag()
    lag.stalls = [(10.1, 90.0), (10.3, 80.0), (10.45, 60.0)]  # three stalls, none alone 200 ms
    assert lag.explained([(10.5, 420.0)], 200.0) == 1  # 230 ms of them while it was awaited: the client's
    assert lag.explained([(10.5, 460.0)], 200.0) == 0  # 260 ms still unexplained: the server's
    assert lag.explained([(12.0, 300.0)], 200.0) == 0  # no stall while it was awaited


def test_a_talking_model_is_given_questions_with_room_to_answer() -> None:
    from streaming.types import SAMPLE_RATE

    clip = soak.conversation_clip(gap=4.0)
    said = soak.conversation_clip(gap=0.0)
    assert clip.dtype == "<i2" and len(clip) == len(said) + 4 * SAMPLE_RATE
    assert abs(said).max() > 1000 and not clip[len(said):].any()  # speech, then 4 s of silence
    with pytest.raises(ValueError, match="--gap"):
        soak.conversation_clip(gap=-1.0)
