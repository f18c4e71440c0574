"""A hand's gesture and finger count from its 21 landmarks (mediapipe's hand model order).

Orientation-free where it can be: a finger is up when its tip is well farther from the wrist than its
middle joint, so a hand tilted sideways still counts. Distances are taken in the picture's proportions:
mediapipe normalizes x by the width and y by the height, so on a 640x480 frame a raw normalized length
across is 3/4 of the same length upward, and a rule on lengths (a thumb against the palm) would change
with the hand's turn and the frame's shape; `aspect` (width / height) undoes that (found on real photos
of hands: a pointing hand counted 2 fingers and a fist 1 on a 640x480 frame, right in the photo's own 3:4).
Landmarks: 0 wrist; thumb 1-4; index 5-8; middle 9-12; ring 13-16; pinky 17-20 (each: base, two joints, tip).
"""

from __future__ import annotations

import numpy as np

from models.vision.types import Landmarks

_FINGERS = ((5, 6, 8), (9, 10, 12), (13, 14, 16), (17, 18, 20))  # (base, middle joint, tip)


def _d(lm: Landmarks, a: int, b: int) -> float:
    return float(np.linalg.norm(lm[a, :2] - lm[b, :2]))


def _square(lm: Landmarks, aspect: float) -> Landmarks:
    """x and y in the same unit (the frame's height), so lengths compare whatever their direction."""
    assert aspect > 0, f"aspect is the frame's width / height, got {aspect}"
    out = lm.copy()
    out[:, 0] *= aspect
    return out


def fingers_up(lm: Landmarks, aspect: float = 1.0) -> tuple[bool, bool, bool, bool, bool]:
    """(thumb, index, middle, ring, pinky) held up; `aspect`: the frame's width / height."""
    assert lm.shape[0] == 21, f"expected 21 hand landmarks, got {lm.shape}"
    lm = _square(lm, aspect)
    palm = max(_d(lm, 0, 9), 1e-6)  # wrist to middle finger base: the hand's scale
    up = [_d(lm, 0, tip) > 1.3 * _d(lm, 0, pip) and _d(lm, 0, tip) > 1.2 * palm for _, pip, tip in _FINGERS]
    # The thumb folds across the palm: up when its tip is far from the index base and beyond its own joint.
    thumb = _d(lm, 4, 5) > 0.55 * palm and _d(lm, 4, 17) > _d(lm, 3, 17) * 1.05
    return (thumb, up[0], up[1], up[2], up[3])


def classify(lm: Landmarks, face_bottom: float | None = None, aspect: float = 1.0) -> tuple[str | None, int]:
    """(gesture or None, fingers held up). `face_bottom`: the face's lowest y, to tell a raised hand;
    `aspect`: the frame's width / height (the landmarks are normalized by each)."""
    thumb, index, middle, ring, pinky = fingers_up(lm, aspect)
    count = sum((thumb, index, middle, ring, pinky))
    four = index and middle and ring and pinky
    upright = lm[12, 1] < lm[0, 1]  # middle fingertip above the wrist
    if four and upright:
        # A hand held up with its palm shown: raised (above the chin, or in the frame's upper part without
        # a face), else an open palm held out ("stop"). Both stop the assistant.
        high = lm[0, 1] < (face_bottom if face_bottom is not None else 0.45)
        return ("raised_hand" if high else "open_palm"), count
    if four:
        return "open_palm", count
    if thumb and not (index or middle or ring or pinky):
        thumb_up = lm[4, 1] < lm[3, 1] < lm[2, 1] and lm[4, 1] < lm[5, 1]
        return ("thumbs_up" if thumb_up else None), count
    if index and not (middle or ring or pinky):
        return "pointing", count
    if index and middle and not (ring or pinky):
        return "victory", count
    if count == 0:
        return "fist", count
    return None, count
