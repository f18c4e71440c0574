"""What perception says about one frame (`Observation`) and about a session now (`VisualState`).

Everything here is plain data that crosses a process boundary (pickled). Coordinates are normalized
to the frame: x and y in [0, 1], y downward, as mediapipe gives them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Landmarks = npt.NDArray[np.float32]  # [N, 3] normalized x, y, z

# Gestures a hand can make (gestures.classify) and the cues a tracker reports when one starts.
GESTURES = ("open_palm", "raised_hand", "thumbs_up", "pointing", "victory", "fist")
CUES = (*GESTURES, "wave", "nod", "shake", "left", "returned", "text")


@dataclass
class FaceObs:
    box: tuple[float, float, float, float]  # x0, y0, x1, y1
    yaw: float  # nose offset from the eyes' midpoint along the line between the eyes / eye distance: 0 facing
    pitch: float  # nose offset across that line, from the eyes (0) towards the chin (1); about 0.45 facing level


@dataclass
class HandObs:
    landmarks: Landmarks  # [21, 3]
    gesture: str | None  # one of GESTURES, or None
    fingers: int  # fingers held up, thumb included


@dataclass
class Observation:
    """One frame's detections; `texts` is None when OCR did not run on it."""

    t: float  # seconds on the session's clock (its micro-turn index * 0.2)
    face: FaceObs | None
    hands: list[HandObs] = field(default_factory=list)
    texts: list[str] | None = None
    people: int = 0  # faces found (`face` is the largest)


@dataclass
class VisualState:
    """A session's picture now, for the policy and the reasoner."""

    present: bool = False  # a person (a face) is in view
    people: int = 0  # how many faces are in view (0 or 1 also when not counted)
    facing: bool = False  # ... and looking at the camera
    gesture: str | None = None  # the most salient hand gesture in view
    fingers: int | None = None  # fingers held up (the hand with most), None without a hand
    texts: tuple[str, ...] = ()  # text in view, last read
    face_box: tuple[float, float, float, float] | None = None  # x0, y0, x1, y1 of the face in view
    frames: int = 0  # observations so far

    def describe(self, source: str = "Camera") -> str:
        """One short line of visual facts, text in view quoted; `source`: "Camera", or "Picture" for a
        still picture sent in the conversation."""
        if self.frames == 0:
            return ""
        parts = []
        looking = "looking at the camera" if self.facing else "looking away"
        if self.present and self.people > 1:
            parts.append(f"{self.people} people are in view, the nearest {looking}")
        elif self.present:
            parts.append("a person is in view, " + looking)
        else:
            parts.append("nobody is in view")
        if self.gesture:
            parts.append("gesture: " + self.gesture.replace("_", " "))
        if self.fingers is not None:
            parts.append(f"fingers held up: {self.fingers}")
        if self.texts:
            parts.append("text in view: " + "; ".join(f'"{t}"' for t in self.texts))
        return f"{source}: " + "; ".join(parts) + "."
