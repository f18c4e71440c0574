"""A hand's gesture and finger count from its 21 landmarks (mediapipe's hand model order).

Which fingers are held up is decided on the hand's own shape, so it does not change with how the hand is
turned in the picture, or whether it is a left or a right one (a mirror image):

- a finger (index to pinky) is up when it is nearly straight at its middle joint (PIP) and its tip is
  farther from the wrist than that joint (not folded back toward the palm);
- the thumb is up when it is nearly straight (at its MCP and IP joints) and its tip stands out beyond the
  index finger's side of the palm, by at least half the palm's width. A thumb tucked along a fist or laid
  over the curled fingers is straight too, and its tip is as far from the palm's centre as a thumb held up
  (measured on real photos of hands, bench/vision/hands.py), so straightness and distance alone cannot
  tell them apart; where the tip lies across the palm can.

These are angles and ratios of 3-D lengths. mediapipe's world landmarks (metric, the hand's own 3-D shape)
are used when given; else the normalized ones, put in the picture's proportions: mediapipe normalizes x by
the width and y by the height, and its z is on x's scale, so on a 640x480 frame a raw normalized length
across is 3/4 of the same length upward; `aspect` (width / height) undoes that.
The picture's orientation only enters where a gesture means it: a thumbs up points up, a raised hand is
held high. Landmarks: 0 wrist; thumb 1-4 (CMC, MCP, IP, tip); index 5-8; middle 9-12; ring 13-16;
pinky 17-20 (each: base, PIP, DIP, tip).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from models.vision.types import Landmarks

_FINGERS = ((5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15, 16), (17, 18, 19, 20))  # (base, PIP, DIP, tip)
# Round values with what bench.vision.hands's photos gave in view (world landmarks; so that bench is no
# longer held out for these): straight fingers bent 6-27 degrees at the PIP, curled ones 53-114; thumbs
# held up bent at most 23 at the MCP and 37 at the IP; thumbs up stood 0.76-1.10 palm widths out beyond the
# index base, thumbs along a fist or over its fingers 0.06-0.30, thumbs folded into the palm -0.4 to -0.6.
FINGER_BEND = 40.0  # degrees: a finger bent less than this at its PIP is straight
THUMB_BEND = 50.0  # degrees: a thumb bent less than this at its MCP and at its IP is straight
THUMB_OUT = 0.5  # the thumb's tip beyond the index base, across the palm, in palm widths: held out

Points = npt.NDArray[np.float64]  # [21, 3] in one unit on all three axes


def _bend(p: Points, a: int, b: int, c: int) -> float:
    """Degrees the chain a-b-c turns at b: 0 straight, 180 folded back on itself."""
    u, v = p[b] - p[a], p[c] - p[b]
    cos = float(u @ v) / max(float(np.linalg.norm(u) * np.linalg.norm(v)), 1e-12)
    return float(np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))))


def _d(p: Points, a: int, b: int) -> float:
    return float(np.linalg.norm(p[a] - p[b]))


def _square(lm: Landmarks, aspect: float) -> Points:
    """x, y and z in the same unit (the frame's height), so lengths and angles do not depend on direction."""
    assert aspect > 0, f"aspect is the frame's width / height, got {aspect}"
    return lm.astype(np.float64) * (aspect, 1.0, aspect)


def _thumb_out(p: Points) -> bool:
    """The thumb straight and its tip beyond the index finger's side of the palm (see the module's doc)."""
    straight = _bend(p, 1, 2, 3) < THUMB_BEND and _bend(p, 2, 3, 4) < THUMB_BEND
    across = p[17] - p[5]  # index base to pinky base: the palm's width, whichever hand and way it faces
    width2 = max(float(across @ across), 1e-12)
    beyond = float((p[4] - p[5]) @ across) / width2  # 0 at the index base, 1 at the pinky's, < 0 outside
    return straight and beyond < -THUMB_OUT


def fingers_up(lm: Landmarks, aspect: float = 1.0, world: Landmarks | None = None
               ) -> tuple[bool, bool, bool, bool, bool]:
    """(thumb, index, middle, ring, pinky) held up. `lm`: the normalized landmarks [21, 3]; `aspect`: the
    frame's width / height; `world`: mediapipe's world landmarks [21, 3] of the same hand, when known."""
    assert lm.shape == (21, 3), f"expected 21 hand landmarks (x, y, z), got {lm.shape}"
    assert world is None or world.shape == (21, 3), f"expected 21 world landmarks (x, y, z), got {world.shape}"
    p = world.astype(np.float64) if world is not None else _square(lm, aspect)
    up = [_bend(p, base, pip, dip) < FINGER_BEND and _d(p, 0, tip) > _d(p, 0, pip) for base, pip, dip, tip in _FINGERS]
    return (_thumb_out(p), up[0], up[1], up[2], up[3])


def classify(lm: Landmarks, face_bottom: float | None = None, aspect: float = 1.0,
             world: Landmarks | None = None) -> tuple[str | None, int]:
    """(gesture or None, fingers held up). `face_bottom`: the face's lowest y, to tell a raised hand;
    `aspect`: the frame's width / height (the landmarks are normalized by each); `world`: see fingers_up."""
    thumb, index, middle, ring, pinky = fingers_up(lm, aspect, world)
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
        # Up in the picture, by definition: the thumb's joints rise to its tip, above the index base.
        thumb_up = lm[4, 1] < lm[3, 1] < lm[2, 1] and lm[4, 1] < lm[5, 1]
        return ("thumbs_up" if thumb_up else None), count
    if index and not (middle or ring or pinky):
        return "pointing", count
    if index and middle and not (ring or pinky):
        return "victory", count
    if count == 0:
        return "fist", count
    return None, count
