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


def head_pose(lm: Landmarks, aspect: float = 1.0) -> tuple[float, float]:
    """(yaw, pitch) proxies from face mesh landmarks [468, 3]: see FaceObs. `aspect`: the frame's width /
    height (mediapipe normalizes x by the width and y by the height).

    Both are measured in the face's own frame, not the picture's: yaw is the nose's offset from the eyes'
    midpoint along the line between the eyes (in eye distances), pitch its offset across that line as a
    fraction of the chin's. A head tilted sideways (rolled) turns that frame with it, so a tilt alone reads
    as neither turned nor nodding. Measured along the picture's x and y instead, the nose of a face tilted
    by 15 degrees moved 0.11-0.14 eye distances sideways (its drop below the eyes, turned), and a face
    looking at the camera read as looking away (bench.vision.hands).
    """
    assert aspect > 0, f"aspect is the frame's width / height, got {aspect}"
    p = lm[:, :2].astype(np.float64) * (aspect, 1.0)  # [468, 2], both in the frame's height
    eyes = (p[EYE_R] + p[EYE_L]) / 2
    across = p[EYE_L] - p[EYE_R]  # the subject's right eye to left: +x on an upright, unmirrored face
    eye_dist = max(float(np.linalg.norm(across)), 1e-6)
    u = across / eye_dist  # along the eyes
    v = np.array([-u[1], u[0]])  # across them, toward the chin (y grows downward)
    nose = p[NOSE] - eyes
    yaw = float(nose @ u) / eye_dist
    pitch = float(nose @ v) / max(float((p[CHIN] - eyes) @ v), 1e-6)
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
