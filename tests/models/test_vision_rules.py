"""The vision rules on landmark and pose sequences, without any model: gestures, finger counts, facing,
nod / shake / wave and leaving, through the tracker that turns observations into cues."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.vision import head
from models.vision.gestures import classify, fingers_up
from models.vision.tracker import Tracker
from models.vision.types import FaceObs, HandObs, Observation, VisualState


def hand(up: set[str], wrist=(0.5, 0.8), scale: float = 0.15, turn: float = 0.0, mirrored: bool = False
         ) -> np.ndarray:
    """21 landmarks of an upright right hand seen palm on; fingers in `up` extended, the others curled;
    then turned by `turn` degrees about the wrist (clockwise as seen, y being down), and mirrored (a left
    hand) if asked."""
    wx, wy = wrist
    lm = np.zeros((21, 3), np.float32)
    lm[0, :2] = (wx, wy)
    for k, (name, dx) in enumerate(zip(("index", "middle", "ring", "pinky"), (-0.3, -0.1, 0.1, 0.3), strict=True)):
        base = 5 + 4 * k
        bx, by = wx + dx * scale, wy - 1.0 * scale
        lm[base, :2] = (bx, by)
        if name in up:  # straight on upward
            for j, f in enumerate((0.4, 0.7, 0.95), start=1):
                lm[base + j, :2] = (bx, by - f * scale)
        else:  # folded back toward the palm
            lm[base + 1, :2] = (bx, by - 0.3 * scale)
            lm[base + 2, :2] = (bx, by - 0.1 * scale)
            lm[base + 3, :2] = (bx, by + 0.15 * scale)
    if "thumb" in up:  # out to the side
        pts = [(-0.3, -0.25), (-0.55, -0.45), (-0.75, -0.6), (-0.95, -0.75)]
    else:  # across the palm
        pts = [(-0.3, -0.25), (-0.35, -0.5), (-0.2, -0.7), (-0.05, -0.75)]
    for i, (dx, dy) in enumerate(pts, start=1):
        lm[i, :2] = (wx + dx * scale, wy + dy * scale)
    c, s = math.cos(math.radians(turn)), math.sin(math.radians(turn))
    lm[:, :2] = (lm[:, :2] - lm[0, :2]) @ np.array([[c, s], [-s, c]], np.float32) + lm[0, :2]
    if mirrored:
        lm[:, 0] = 2 * wx - lm[:, 0]
    return lm


@pytest.mark.parametrize(("up", "kw", "gesture", "count"), [
    ({"thumb", "index", "middle", "ring", "pinky"}, {}, "open_palm", 5),
    ({"thumb", "index", "middle", "ring", "pinky"}, {"wrist": (0.5, 0.3)}, "raised_hand", 5),
    ({"thumb"}, {"turn": 90}, "thumbs_up", 1),  # a fist on its side, fingers to the right, the thumb up
    ({"thumb"}, {"turn": -90}, None, 1),  # ... to the left: the thumb points down
    ({"thumb"}, {"turn": 90, "mirrored": True}, "thumbs_up", 1),
    ({"index"}, {}, "pointing", 1),
    ({"index", "middle"}, {}, "victory", 2),
    (set(), {}, "fist", 0),
    ({"index", "middle", "ring"}, {}, None, 3),
])
def test_gestures_and_finger_counts(up, kw, gesture, count) -> None:
    assert classify(hand(up, **kw)) == (gesture, count)


@pytest.mark.parametrize("up", [{"thumb", "index", "middle", "ring", "pinky"}, {"index"}, {"index", "thumb"},
                                {"index", "middle"}, set(), {"thumb"}, {"middle", "ring", "pinky"}])
def test_fingers_up_do_not_depend_on_the_hand_turning_or_being_a_left_one(up: set[str]) -> None:
    """Angles and ratios of lengths: the same fingers whichever way the hand is turned in the picture,
    mirrored too, on a 4:3 frame (x and y normalized by different lengths) as on a square one."""
    names = ("thumb", "index", "middle", "ring", "pinky")
    want = tuple(n in up for n in names)
    for turn in (-150.0, -30.0, -15.0, 0.0, 15.0, 30.0, 90.0, 180.0):
        for mirrored in (False, True):
            lm = hand(up, wrist=(0.5, 0.5), turn=turn, mirrored=mirrored)
            assert fingers_up(lm) == want, (turn, mirrored)
            wide = lm.copy()
            wide[:, 0] = 0.5 + (lm[:, 0] - 0.5) * 480 / 640  # the same hand on a 640x480 frame
            assert fingers_up(wide, 640 / 480) == want, (turn, mirrored, "4:3")


def test_a_thumb_along_a_fist_or_over_its_fingers_is_not_up_even_when_straight() -> None:
    """The thumb is straight in both; it is up only when its tip stands out beyond the index's side."""
    fist = hand(set())
    fist[1:5, :2] = fist[0, :2] + 0.15 * np.array([(-0.3, -0.25), (-0.4, -0.55), (-0.4, -0.8), (-0.38, -1.0)])
    assert fingers_up(fist)[0] is False  # along the index's side, pointing up the hand
    fist[1:5, :2] = fist[0, :2] + 0.15 * np.array([(-0.3, -0.25), (-0.2, -0.5), (-0.05, -0.65), (0.1, -0.78)])
    assert fingers_up(fist)[0] is False  # laid across the curled fingers
    assert classify(fist) == ("fist", 0)


def test_rotated_hand_counts_the_same() -> None:
    lm = hand({"index", "middle"})
    c, s = math.cos(0.6), math.sin(0.6)
    rot = lm.copy()
    rot[:, :2] = (lm[:, :2] - lm[0, :2]) @ np.array([[c, -s], [s, c]], np.float32) + lm[0, :2]
    assert classify(rot) == ("victory", 2)


def test_swings_and_head_rules() -> None:
    nod = [(i * 0.2, 0.45 + 0.1 * math.sin(i * 0.2 * 2 * math.pi / 0.8)) for i in range(8)]  # 1.25 Hz, +-0.1
    still = [(i * 0.2, 0.0) for i in range(8)]
    assert head.nodding(nod, still) and not head.shaking(still, nod)
    shake = [(t, 2.5 * (v - 0.45)) for t, v in nod]
    assert head.shaking(shake, still) and not head.nodding(still, shake)
    jitter = [(i * 0.2, 0.45 + 0.01 * (-1) ** i) for i in range(8)]
    assert not head.nodding(jitter, still)
    assert head.facing(0.05, 0.45) and not head.facing(0.45, 0.45) and not head.facing(0.0, 0.9)


def face_mesh(nose_dx: float, roll_deg: float, size: tuple[int, int] = (640, 480)) -> np.ndarray:
    """Face mesh landmarks [468, 3] (only the nose, eyes and chin set) of a face on a `size` (w, h) frame,
    its nose `nose_dx` eye distances aside (a turn), the whole face rolled by `roll_deg` about the eyes."""
    w, h = size
    pts = {head.EYE_R: (-30.0, 0.0), head.EYE_L: (30.0, 0.0), head.NOSE: (60.0 * nose_dx, 30.0),
           head.CHIN: (0.0, 90.0)}  # pixels from the eyes' midpoint, y down
    c, s = math.cos(math.radians(roll_deg)), math.sin(math.radians(roll_deg))
    lm = np.zeros((468, 3), np.float32)
    for i, (x, y) in pts.items():
        lm[i, :2] = ((w / 2 + c * x - s * y) / w, (h / 2 + s * x + c * y) / h)  # normalized as mediapipe's
    return lm


@pytest.mark.parametrize("roll", [-30.0, -15.0, 15.0, 30.0])
@pytest.mark.parametrize("nose_dx", [0.0, 0.15, 0.4])
def test_head_pose_does_not_change_when_the_head_tilts(nose_dx: float, roll: float) -> None:
    """Yaw and pitch are taken in the face's frame: a tilted (rolled) head reads as it does upright, on a
    4:3 frame too (x and y are fractions of different lengths), so facing does not depend on the tilt."""
    upright = head.head_pose(face_mesh(nose_dx, 0.0), 640 / 480)
    assert upright == pytest.approx((nose_dx, 1 / 3), abs=1e-5)
    assert head.head_pose(face_mesh(nose_dx, roll), 640 / 480) == pytest.approx(upright, abs=1e-5)
    assert head.head_pose(face_mesh(nose_dx, roll, (480, 640)), 480 / 640) == pytest.approx(upright, abs=1e-5)
    assert head.facing(*head.head_pose(face_mesh(nose_dx, roll), 640 / 480)) == (nose_dx < head.FACING_YAW)


def _face(yaw: float = 0.0, pitch: float = 0.45) -> FaceObs:
    return FaceObs(box=(0.4, 0.2, 0.6, 0.5), yaw=yaw, pitch=pitch)


def _hand_obs(lm: np.ndarray) -> HandObs:
    g, n = classify(lm)
    return HandObs(landmarks=lm, gesture=g, fingers=n)


def test_tracker_reports_each_cue_once_when_it_begins() -> None:
    tr = Tracker()
    cues: list[tuple[int, list[str]]] = []

    def feed(i: int, face: FaceObs | None, hands: list[HandObs] | None = None) -> None:
        cues.append((i, tr.update(Observation(t=i * 0.2, face=face, hands=hands or []))))

    for i in range(3):
        feed(i, _face())
    assert tr.state.present and tr.state.facing
    palm = _hand_obs(hand({"thumb", "index", "middle", "ring", "pinky"}))
    for i in range(3, 6):  # held for three frames: one cue
        feed(i, _face(), [palm])
    for i, pitch in enumerate((0.45, 0.55, 0.62, 0.5, 0.4, 0.52, 0.6), start=6):  # a nod
        feed(i, _face(pitch=pitch))
    feed(13, _face(yaw=0.5))  # looks away
    assert not tr.state.facing and tr.state.present
    feed(14, None)  # one missed frame is not leaving
    feed(15, None)
    feed(16, None)
    feed(17, _face())
    flat = [(i, c) for i, cs in cues for c in cs]
    assert [i for i, c in flat if c == "open_palm"] == [3]
    assert [c for _, c in flat].count("nod") == 1
    assert [i for i, c in flat if c == "left"] == [15]
    assert [i for i, c in flat if c == "returned"] == [17]
    assert tr.state.present


def test_wave_from_a_moving_open_hand() -> None:
    tr = Tracker()
    seen: list[str] = []
    for i in range(10):
        x = 0.5 + 0.08 * math.sin(i * math.pi / 2)  # side to side, a swing every 0.4 s
        seen += tr.update(Observation(t=i * 0.2, face=_face(),
                                      hands=[_hand_obs(hand({"thumb", "index", "middle", "ring", "pinky"},
                                                            wrist=(x, 0.8)))]))
    assert "wave" in seen and seen.count("open_palm") == 1


def test_describe_quotes_text() -> None:
    s = VisualState(present=True, facing=True, gesture="victory", fingers=2, texts=("OPEN 9 TO 5",), frames=3)
    assert s.describe() == ('Camera: a person is in view, looking at the camera; gesture: victory; '
                            'fingers held up: 2; text in view: "OPEN 9 TO 5".')
    assert VisualState().describe() == ""


def test_what_the_cascade_does_on_visual_cues() -> None:
    """models/cascade/sight.react: a hand held up stops the answer, a nod does not, leaving holds it."""
    from models.cascade.sight import SightState, react

    s = SightState()
    palm = _hand_obs(hand({"thumb", "index", "middle", "ring", "pinky"}))
    t = iter(range(100))

    def see(face: FaceObs | None, hands: list[HandObs] | None = None, speaking: bool = True) -> tuple[list[str], bool]:
        i = next(t)
        return react(s, [Observation(t=i * 0.2, face=face, hands=hands or [])], [], i, speaking)

    assert see(_face()) == ([], False)
    assert see(_face(), [palm]) == (["open_palm"], True), "an open palm while it speaks: stop"
    assert see(_face(), [palm]) == ([], False), "held: one stop, not one a frame"
    see(_face())
    assert see(_face(), [palm], speaking=False) == (["open_palm"], False), "silent: nothing to stop"
    nod = [see(_face(pitch=p)) for p in (0.45, 0.55, 0.62, 0.5, 0.4, 0.52)]
    assert any("nod" in cues for cues, _ in nod) and not any(stop for _, stop in nod), "a nod: it keeps talking"
    see(None)
    assert see(None) == (["left"], False) and s.away, "left mid-answer: the answer is held"
    assert see(_face()) == (["returned"], False) and not s.away, "back: it picks up"


def test_an_answer_held_for_the_user_goes_on_when_the_camera_goes_off() -> None:
    from models.cascade.sight import CAMERA_GONE_TICKS, Sight, SightState

    sight, s = Sight(), SightState(frame=np.zeros((8, 8, 3), np.uint8), frame_tick=5, away=True)
    sight.look("s", s, None, 5 + CAMERA_GONE_TICKS, question=False)
    assert s.away, "a frame may still come"
    sight.look("s", s, None, 6 + CAMERA_GONE_TICKS, question=False)
    assert not s.away and sight.worker is None, "no frames: the camera is off; no worker was started for it"
