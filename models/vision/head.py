"""Rules on tracks over time: where a face looks, nods and shakes, waves. No model, no state but the track.

A track is a sequence of (t seconds, value). A nod is the head's pitch going down and up again (at least
two reversals of at least `amp` within `window` seconds) while its yaw stays put; a shake is the same on
yaw; a wave is the wrist going side to side. mediapipe's tracking at 5 frames a second sees a nod (about
0.5 s a swing) as 2-4 samples each way, so the rules ask for little.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from models.vision.types import Landmarks

# Face mesh landmarks: nose tip, the eyes' outer corners, chin.
NOSE, EYE_R, EYE_L, CHIN = 1, 33, 263, 152
FACING_YAW = 0.25  # |yaw| under this: looking at the camera
FACING_PITCH = (0.2, 0.75)  # pitch within this: not looking far up or down

Track = Sequence[tuple[float, float]]


def head_pose(lm: Landmarks) -> tuple[float, float]:
    """(yaw, pitch) proxies from face mesh landmarks [468, 3]: see FaceObs."""
    eyes = (lm[EYE_R, :2] + lm[EYE_L, :2]) / 2
    eye_dist = max(float(np.linalg.norm(lm[EYE_R, :2] - lm[EYE_L, :2])), 1e-6)
    yaw = float(lm[NOSE, 0] - eyes[0]) / eye_dist
    span = max(float(lm[CHIN, 1] - eyes[1]), 1e-6)
    pitch = float(lm[NOSE, 1] - eyes[1]) / span
    return yaw, pitch


def facing(yaw: float, pitch: float) -> bool:
    return abs(yaw) < FACING_YAW and FACING_PITCH[0] < pitch < FACING_PITCH[1]


def swings(track: Track, amp: float) -> int:
    """Monotone runs of at least `amp` between reversals (hysteresis: smaller wiggles are noise)."""
    vals = [v for _, v in track]
    if not vals:
        return 0
    count, direction = 0, 0
    lo = hi = peak = vals[0]
    for v in vals[1:]:
        if direction == 0:  # no swing yet: wait for a move of `amp` either way from the start
            lo, hi = min(lo, v), max(hi, v)
            if v - lo >= amp or hi - v >= amp:
                direction, peak, count = (1 if v - lo >= amp else -1), v, 1
        elif (v - peak) * direction > 0:  # further the same way
            peak = v
        elif abs(v - peak) >= amp:  # came back far enough: a reversal
            direction, peak, count = -direction, v, count + 1
    return count


def _recent(track: Track, window: float) -> list[tuple[float, float]]:
    if not track:
        return []
    end = track[-1][0]
    return [(t, v) for t, v in track if t >= end - window]


def _range(track: Track) -> float:
    return (max(v for _, v in track) - min(v for _, v in track)) if track else 0.0


def nodding(pitch: Track, yaw: Track, window: float = 1.6, amp: float = 0.06) -> bool:
    """The head went down and up (twice or more) in the last `window` s, while not turning."""
    p, y = _recent(pitch, window), _recent(yaw, window)
    return swings(p, amp) >= 2 and _range(y) < 2.0 * _range(p)


def shaking(yaw: Track, pitch: Track, window: float = 1.6, amp: float = 0.12) -> bool:
    """The head turned side to side (left-right-left or so) in the last `window` s."""
    y, p = _recent(yaw, window), _recent(pitch, window)
    return swings(y, amp) >= 3 and _range(p) < _range(y)


def waving(wrist_x: Track, window: float = 2.0, amp: float = 0.05) -> bool:
    """An open hand went side to side (three swings or more) in the last `window` s."""
    return swings(_recent(wrist_x, window), amp) >= 3
