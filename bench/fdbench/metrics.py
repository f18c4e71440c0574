"""Full-Duplex-Bench metrics as pure functions of words, segments and times.

Every rule here follows the official evaluation scripts (v1.0 `eval_*.py`), including their quirks,
because numbers are only comparable when the arithmetic is the same; where a quirk is kept on purpose
the comment says so. Nothing here reads files, runs an ASR or knows about tasks on disk.

Times are seconds on the input's timeline. A word is `Word(text, start, end)`; `end` may be None as
in the official `output.json` chunks. A VAD segment is `(start, end)`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.spatial.distance import jensenshannon

# Official thresholds (eval_pause_handling.py & co.): a take-over lasts at least 1 s or has > 3 words.
TURN_DURATION_S = 1.0
TURN_MAX_WORDS = 3
# eval_backchannel.py: a VAD segment longer than this is the model formally speaking, not a backchannel.
BACKCHANNEL_MAX_S = 3.0
# eval_backchannel.py: histogram bin width and smoothing constant.
BC_WINDOW_S = 0.2
BC_EPSILON = 1e-10
# Overlap figures (local, not official): a silence shorter than this inside the model's speech is a
# pause between words or sentences, not a stop. VAD splits speech at 100 ms of silence, so without it
# "still talking when the overlap ended" depended on whether that instant fell between two words
# (held-out seed 2222: a 30 ms and a 100 ms gap read as stops). 200 ms is the usual inter-pausal
# unit threshold of turn-taking studies; a model that really yields stays silent far longer.
MICRO_PAUSE_S = 0.2


class Word(NamedTuple):
    text: str
    start: float
    end: float | None


Segment = tuple[float, float]


def takeover(words: Sequence[Word]) -> int:
    """TOR of one sample: 1 when the model took the floor, else 0.

    No words -> 0. Otherwise the span from the first word's start to the last word's end decides:
    under 1 s with at most 3 words is not a take-over. A last word without an end uses its start,
    as eval_pause_handling.py does.
    """
    if not words:
        return 0
    last = words[-1]
    last_end = last.end if last.end is not None else last.start
    duration = last_end - words[0].start
    if duration < TURN_DURATION_S and len(words) <= TURN_MAX_WORDS:
        return 0
    return 1


def raw_latency(words: Sequence[Word], reference: float) -> float | None:
    """First word start minus `reference` (user turn end / interruption end) for a take-over, else None.

    Negative values mean the model started before the user finished; the official scripts floor
    them to 0 (see `floored`), which hides early speech, so the raw value is kept too.
    """
    if takeover(words) == 0:
        return None
    return words[0].start - reference


def floored(latency: float | None) -> float | None:
    """The official latency: negative values count as 0."""
    return None if latency is None else max(0.0, latency)


def mean(values: Sequence[float | None]) -> float | None:
    """Mean over the defined values; None when there are none (the official scripts print 0.0 there)."""
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


def early_speech_rate(latencies: Sequence[float | None]) -> float | None:
    """Share of take-overs whose first word started before the reference time (raw latency < 0)."""
    defined = [v for v in latencies if v is not None]
    if not defined:
        return None
    return sum(1 for v in defined if v < 0) / len(defined)


def words_in_segment(words: Sequence[Word], start: float, end: float) -> list[str]:
    """Words overlapping a VAD segment, with the exact overlap tests of eval_backchannel.py."""
    found = []
    for w in words:
        t_start, t_end = w.start, w.end
        # Official: words without a start, or open-ended words starting inside, are skipped.
        if t_start is None or (t_end is None and t_start < end):
            continue
        if t_end is None:
            t_end = t_start
        if (
            (t_start >= start and t_end <= end)
            or (t_start <= end and t_end > end)
            or (t_start <= start and t_end > start)
        ):
            found.append(w.text)
    return found


@dataclass
class BackchannelResult:
    tor: int  # 1 when the model took the floor instead of backchannelling
    backchannels: list[Segment]  # the segments counted as backchannels
    frequency: float  # backchannels per second of clip
    jsd: float  # Jensen-Shannon distance to the ground-truth timing distribution


def backchannel_tor(segments: Sequence[Segment], words: Sequence[Word]) -> tuple[int, list[Segment]]:
    """TOR and backchannel segments of one clip, exactly as eval_backchannel.py computes them.

    Kept quirk: each short segment *overwrites* TOR, so the verdict is that of the last short
    segment unless a segment longer than 3 s came first (which stops the scan with TOR = 1).
    Every segment of at most 3 s seen before that point is counted as a backchannel.
    """
    tor = 0
    backchannels: list[Segment] = []
    for start, end in segments:
        duration = end - start
        if duration > BACKCHANNEL_MAX_S:
            tor = 1
            break
        n_words = len(words_in_segment(words, start, end))
        if n_words > 3:
            tor = 1
        elif duration < 1:
            tor = 0 if n_words <= 2 else 1
        else:
            tor = 1
        backchannels.append((start, end))
    return tor, backchannels


def backchannel_histogram(backchannels: Sequence[Segment], clip_seconds: float) -> np.ndarray:
    """Normalised count of backchannels per 0.2 s bin (every bin a segment touches counts)."""
    bins = np.zeros(int(clip_seconds / BC_WINDOW_S) + 1)
    for start, end in backchannels:
        for i in range(int(start / BC_WINDOW_S), int(end / BC_WINDOW_S) + 1):
            if i < len(bins):
                bins[i] += 1
    bins = bins + BC_EPSILON
    return bins / bins.sum()


def backchannel_jsd(backchannels: Sequence[Segment], clip_seconds: float, gt: Sequence[float]) -> float:
    """Jensen-Shannon distance (natural log) between predicted timing and the ground truth.

    No backchannel at all scores 1, as in the official script. The ground truth is linearly
    resampled onto the prediction's bin count (both span [0, 1]), as the official interp1d does.
    """
    if not backchannels:
        return 1.0
    if len(gt) == 0:
        raise ValueError("ground-truth backchannel distribution is empty; regenerate or fix the gt file")
    hist = backchannel_histogram(backchannels, clip_seconds)
    gt_arr = np.asarray(gt, dtype=np.float64)
    if len(gt_arr) == 1:
        resized = np.full(len(hist), gt_arr[0])
    else:
        resized = np.interp(np.linspace(0, 1, len(hist)), np.linspace(0, 1, len(gt_arr)), gt_arr)
    return float(jensenshannon(hist, resized))


def backchannel(
    segments: Sequence[Segment], words: Sequence[Word], clip_seconds: float, gt: Sequence[float]
) -> BackchannelResult:
    """All backchannel figures of one clip."""
    if clip_seconds <= 0:
        raise ValueError(f"clip length must be positive, got {clip_seconds} s")
    tor, bcs = backchannel_tor(segments, words)
    return BackchannelResult(tor, bcs, len(bcs) / clip_seconds, backchannel_jsd(bcs, clip_seconds, gt))


def talk_spans(segments: Sequence[Segment], max_pause: float = MICRO_PAUSE_S) -> list[Segment]:
    """VAD segments with the pauses shorter than `max_pause` between them closed: spans of talking."""
    spans: list[Segment] = []
    for start, end in sorted(segments):
        if spans and start - spans[-1][1] < max_pause:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


def stop_latency(segments: Sequence[Segment], overlap_start: float, tolerance: float = 0.05) -> float | None:
    """How long the model kept talking after the user's overlap began.

    Takes the output VAD segment that is active at `overlap_start` (within `tolerance`, so a
    segment ending a hair before still counts as speaking) and returns its end minus the
    overlap start. None when the model was silent when the overlap began (nothing to stop).
    """
    for start, end in segments:
        if start <= overlap_start + tolerance and end > overlap_start - tolerance:
            return max(0.0, end - overlap_start)
    return None


def response_latency(segments: Sequence[Segment], overlap_end: float) -> float | None:
    """Time from the end of the user's overlap to the onset of the model's next speech.

    None when the model never starts a new segment after the overlap ended (no response, or it
    kept talking straight through; `stop_latency` tells which).
    """
    for start, _end in segments:
        if start >= overlap_end:
            return start - overlap_end
    return None


def speaking_at(segments: Sequence[Segment], t: float) -> bool:
    """Whether a VAD segment covers time t."""
    return any(start <= t < end for start, end in segments)


def kept_talking(
    segments: Sequence[Segment],
    overlap_start: float,
    overlap_end: float,
    clean: Sequence[Segment] | None = None,
) -> bool | None:
    """Whether the model talked through an overlap: speaking when it began and still when it ended.

    None when there is nothing to keep: the model was silent at the overlap's start, or (given the
    output for the same input without the overlap, `clean`) it would have finished speaking before the
    overlap's end anyway: a reply that ends on its own is no sign of being cut off. Used for overlaps
    that should not take the floor (a backchannel, background speech); a local figure, not an official one.
    """
    if not speaking_at(segments, overlap_start):
        return None
    if clean is not None and not speaking_at(clean, overlap_end):
        return None
    return speaking_at(segments, overlap_end)
