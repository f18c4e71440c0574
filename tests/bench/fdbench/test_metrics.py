"""Metric functions on hand-made words and segments whose answers are known by hand."""

import math

import numpy as np
import pytest

from bench.fdbench import metrics as m
from bench.fdbench.metrics import Word


def words(*spans: tuple[float, float | None]) -> list[Word]:
    return [Word(f"w{i}", s, e) for i, (s, e) in enumerate(spans)]


@pytest.mark.parametrize(
    ("spans", "expected"),
    [
        ((), 0),  # no words: the model stayed silent
        (((1.0, 1.2), (1.3, 1.5), (1.6, 1.9)), 0),  # 3 words in 0.9 s: short, not a take-over
        (((1.0, 1.2), (1.3, 1.5), (1.6, 1.7), (1.75, 1.9)), 1),  # 4 words, even in 0.9 s
        (((1.0, 2.2),), 1),  # one long word: 1.2 s
        (((1.0, 1.5), (1.6, 2.0)), 1),  # exactly 1.0 s is not "under 1 s"
        (((1.0, 1.2), (1.95, None)), 0),  # open last word: its start counts (0.95 s)
        (((1.0, 1.2), (2.1, None)), 1),  # open last word starting 1.1 s later
    ],
)
def test_takeover_rules(spans: tuple[tuple[float, float | None], ...], expected: int) -> None:
    assert m.takeover(words(*spans)) == expected


def test_latency_is_raw_then_floored_at_zero() -> None:
    early = words((2.5, 3.0), (3.1, 3.8))  # starts 0.5 s before the user finished at 3.0
    assert m.raw_latency(early, 3.0) == pytest.approx(-0.5)
    assert m.floored(m.raw_latency(early, 3.0)) == 0.0
    late = words((3.4, 4.0), (4.1, 4.6))
    assert m.floored(m.raw_latency(late, 3.0)) == pytest.approx(0.4)
    # No take-over: no latency at all, and it is left out of the mean (official: only TOR == 1).
    assert m.raw_latency(words((3.2, 3.4)), 3.0) is None
    assert m.mean([0.4, None, 0.0]) == pytest.approx(0.2)
    assert m.mean([None]) is None
    assert m.early_speech_rate([-0.5, 0.4, None, 0.1]) == pytest.approx(1 / 3)


def test_words_in_segment_uses_official_overlap_tests() -> None:
    ws = [
        Word("inside", 1.1, 1.4),
        Word("spans_end", 1.8, 2.2),
        Word("spans_start", 0.8, 1.05),
        Word("before", 0.2, 0.5),
        Word("after", 2.5, 2.8),
        Word("open_inside", 1.5, None),
    ]
    # The open-ended word starting inside the segment is skipped, as in eval_backchannel.py.
    assert m.words_in_segment(ws, 1.0, 2.0) == ["inside", "spans_end", "spans_start"]


def test_backchannel_tor_and_counting() -> None:
    yeah = [Word("yeah", 1.0, 1.3)]
    assert m.backchannel_tor([(1.0, 1.4)], yeah) == (0, [(1.0, 1.4)])
    # A segment over 3 s is the model formally speaking: TOR 1 and the scan stops.
    tor, bcs = m.backchannel_tor([(1.0, 1.4), (2.0, 5.5), (6.0, 6.3)], yeah)
    assert tor == 1 and bcs == [(1.0, 1.4)]
    # Under 1 s with 3 words is a take-over; 1-3 s is a take-over whatever the words.
    three = [Word(w, 1.0 + i * 0.2, 1.1 + i * 0.2) for i, w in enumerate(["oh", "i", "see"])]
    assert m.backchannel_tor([(1.0, 1.6)], three)[0] == 1
    assert m.backchannel_tor([(1.0, 2.5)], [])[0] == 1
    # Kept official quirk: the last short segment's verdict wins.
    many = [Word(str(i), 1.0 + i * 0.1, 1.05 + i * 0.1) for i in range(5)]
    assert m.backchannel_tor([(1.0, 1.6), (4.0, 4.3)], many)[0] == 0


def test_jsd_identical_is_zero_and_missing_is_one() -> None:
    bcs = [(1.0, 1.3), (4.2, 4.5)]
    gt = m.backchannel_histogram(bcs, 10.0)
    assert m.backchannel_jsd(bcs, 10.0, list(gt)) == pytest.approx(0.0, abs=1e-6)
    assert m.backchannel_jsd([], 10.0, list(gt)) == 1.0
    # Disjoint distributions reach the natural-log maximum sqrt(ln 2) (up to the epsilon smoothing).
    far = m.backchannel_histogram([(8.0, 8.2)], 10.0)
    assert m.backchannel_jsd(bcs, 10.0, list(far)) == pytest.approx(math.sqrt(math.log(2)), abs=1e-3)


def test_jsd_resamples_ground_truth_to_prediction_length() -> None:
    # A flat ground truth of any length is flat after resampling; a flat prediction then matches it.
    clip = 2.0
    flat_pred = [(0.0, clip)]  # one segment touching every bin
    assert m.backchannel_jsd(flat_pred, clip, list(np.ones(37) / 37)) == pytest.approx(0.0, abs=1e-6)


def test_backchannel_frequency_is_per_clip_second() -> None:
    res = m.backchannel([(1.0, 1.3), (5.0, 5.4)], [Word("mm", 1.0, 1.2)], 20.0, [1.0])
    assert res.frequency == pytest.approx(0.1)
    assert res.tor == 0


def test_stop_and_response_latency() -> None:
    segs = [(0.5, 2.0), (3.0, 6.4), (8.0, 9.0)]
    assert m.stop_latency(segs, 5.0) == pytest.approx(1.4)  # kept talking 1.4 s into the overlap
    assert m.stop_latency(segs, 2.5) is None  # silent when the overlap began
    assert m.response_latency(segs, 7.0) == pytest.approx(1.0)
    assert m.response_latency(segs, 8.5) is None  # talking through the end, no new onset
    assert m.speaking_at(segs, 3.5) and not m.speaking_at(segs, 7.0)


def test_kept_talking_counts_only_what_the_clean_run_was_still_saying() -> None:
    out = [(3.0, 5.5)]  # stops 0.5 s into a 5.0-7.0 s overlap
    assert m.kept_talking(out, 5.0, 7.0) is False
    # Without the overlap it would have stopped at 5.6 as well: nothing was cut off.
    assert m.kept_talking(out, 5.0, 7.0, clean=[(3.0, 5.6)]) is None
    assert m.kept_talking(out, 5.0, 7.0, clean=[(3.0, 9.0)]) is False  # it was cut off
    assert m.kept_talking([(3.0, 9.0)], 5.0, 7.0, clean=[(3.0, 9.0)]) is True
    assert m.kept_talking([(6.0, 9.0)], 5.0, 7.0, clean=[(3.0, 9.0)]) is None  # silent at the start


def test_a_pause_between_words_is_not_a_stop() -> None:
    # VAD splits speech at 100 ms of silence; a 30 ms gap straddling the overlap's end (7.0 s) must
    # not read as the model having stopped, while a real yield (2.1 s of silence) still does.
    words = [(3.0, 6.98), (7.01, 9.0)]
    assert m.talk_spans(words) == [(3.0, 9.0)]
    assert m.kept_talking(m.talk_spans(words), 5.0, 7.0) is True
    assert m.kept_talking(words, 5.0, 7.0) is False  # what the raw segments said
    assert m.stop_latency(m.talk_spans(words), 5.0) == pytest.approx(4.0)
    yielded = [(3.0, 5.5), (7.6, 9.0)]  # stopped 0.5 s in, answered after the overlap
    assert m.talk_spans(yielded) == yielded
    assert m.kept_talking(m.talk_spans(yielded), 5.0, 7.0) is False
    assert m.talk_spans([(5.0, 6.0), (1.0, 2.0), (2.1, 2.5)]) == [(1.0, 2.5), (5.0, 6.0)]  # unsorted input
    assert m.talk_spans([(1.0, 3.0), (1.5, 2.0)]) == [(1.0, 3.0)]  # a segment inside another
    assert m.talk_spans([]) == []
