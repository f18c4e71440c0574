"""A session's observations over time -> its visual state now and the cues that just began.

Pure state and rules (no model, no clock: times come with the observations), so it is tested on made-up
observation sequences. A cue is reported once when it starts (a gesture held for several frames is
one `open_palm`), and again only after it stopped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from models.vision import head
from models.vision.types import Observation, VisualState

TRACK_SECONDS = 2.5  # how much pose and wrist history is kept
ABSENT_SECONDS = 0.35  # no face for this long: the person left (two frames at 5 a second)
GESTURE_ORDER = ("raised_hand", "open_palm", "thumbs_up", "victory", "pointing", "fist")  # most salient first


@dataclass
class Tracker:
    state: VisualState = field(default_factory=VisualState)
    yaw: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))  # (t, yaw)
    pitch: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))  # (t, pitch)
    wrist_x: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))  # open hand's wrist
    last_face_t: float | None = None  # when a face was last seen
    active: set[str] = field(default_factory=set)  # cues going on now (reported when they began)

    def update(self, obs: Observation) -> list[str]:
        """Take one frame's observation; the cues that began with it."""
        s, t = self.state, obs.t
        s.frames += 1
        for track in (self.yaw, self.pitch, self.wrist_x):
            while track and track[0][0] < t - TRACK_SECONDS:
                track.popleft()
        now: set[str] = set()
        if obs.face is not None:
            if not s.present and s.frames > 1 and "left" in self.active:
                now.add("returned")
            self.last_face_t, s.present, s.face_box, s.people = t, True, obs.face.box, obs.people
            s.facing = head.facing(obs.face.yaw, obs.face.pitch)
            self.yaw.append((t, obs.face.yaw))
            self.pitch.append((t, obs.face.pitch))
            if head.nodding(self.pitch, self.yaw):
                now.add("nod")
            elif head.shaking(self.yaw, self.pitch):
                now.add("shake")
        elif self.last_face_t is None or t - self.last_face_t >= ABSENT_SECONDS:
            if s.present or "left" in self.active:
                now.add("left")
            s.present = s.facing = False
            s.face_box, s.people = None, 0
            self.yaw.clear()
            self.pitch.clear()
        gestures = {h.gesture for h in obs.hands if h.gesture}
        s.gesture = next((g for g in GESTURE_ORDER if g in gestures), None)
        s.fingers = max((h.fingers for h in obs.hands), default=None)
        if s.gesture:
            now.add(s.gesture)
        open_hands = [h for h in obs.hands if h.gesture in ("open_palm", "raised_hand")]
        if open_hands:
            self.wrist_x.append((t, float(open_hands[0].landmarks[0, 0])))
            if head.waving(self.wrist_x):
                now.add("wave")
        else:
            self.wrist_x.clear()
        if obs.texts is not None:
            self.read(obs.texts)
        began = sorted(now - self.active)
        # "left" stays active until the person is back; "returned" is a moment
        self.active = (now - {"returned"}) | ({"left"} if "left" in self.active and not s.present else set())
        return began

    def read(self, texts: list[str]) -> bool:
        """An OCR reading arrived; True when the text in view changed."""
        new = tuple(texts)
        changed = new != self.state.texts
        self.state.texts = new
        return changed
