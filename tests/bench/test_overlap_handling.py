"""bench.overlap_handling's driver on the real cascade: an interruption over the reply is measured as a pause and
a stop, a backchannel as kept talking, a clip without speech is left out."""

from __future__ import annotations

import random

import numpy as np

from bench.overlap_handling import _speech, _talking, run_one
from models.cascade import CascadeModel


def test_the_overlap_bench_measures_an_interruptions_pause(default_cascade: CascadeModel) -> None:
    # The bench's own default (`--model-options ""`): the suite's shared default cascade (tests/conftest.py),
    # one load fewer. Every session the driver opens is closed by it.
    m = default_cascade
    question = _speech("What is the tallest tower in the world?")
    s = _talking(m, question)
    assert sum(s.loud) >= 10 and not s.yielded  # the reply the overlap will be played over
    s.close()
    r = run_one(m, question, _speech("Wait, stop, I need something else."), random.Random(0))
    assert r is not None and r["paused"] is not None and 0.0 < r["paused"] < 1.2, r
    assert r["cause"] in ("probe", "length") and r["yielded"] and not r["kept"], r
    assert r["silent_s"] >= 1.0 and "stop" in (r["words"] or ""), r
    r = run_one(m, question, _speech("Yeah."), random.Random(0))
    assert r is not None and r["kept"] and not r["yielded"] and "yeah" in (r["words"] or ""), r
    assert run_one(m, question, np.zeros(24_000, dtype=np.float32), random.Random(0)) is None
