"""Head motion made from one real photo: clips of a face nodding, shaking or holding still, for the real
detectors (models/vision/detect.py) and the rules on top of them (head.py, tracker.py).

A 2-D warp of a flat photo cannot turn a head: a nose turned with a plane stays on the eyes' midline. So
the face is given depth: face mesh's 468 landmarks of the still photo (x, y and its relative depth z) are
turned in 3-D about a pivot behind the face (the neck's, for a nod: below and behind), projected back
onto the picture, and the photo is warped piecewise-linearly from the turned landmarks back to the still
ones (a backward map through their triangulation; a ring of fixed points around the face blends the warp
into the rest of the photo). The nose then moves against the eyes and chin as it does when a head turns.

Each clip draws its amplitude, rate, start phase, scale, position and background from a seeded generator:
`clips(n, seed)`; tune on one seed and report on another (bench/vision/cost.py `--motion`).

    pose(t) = amplitude * sin(2 pi f t + phase)   (pitch for a nod, yaw for a shake)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
from PIL import Image
from scipy.spatial import Delaunay

FPS = 5.0  # the camera extension's rate, and the worker's at most
FRAME = (480, 640)  # H, W of a clip's frames
DATA = Path(__file__).resolve().parents[2] / "tests" / "models" / "data"
KINDS = ("nod", "shake", "still", "glance")  # a glance: one look aside and back (neither cue)
# What a clip may be: a nod's pitch and a shake's yaw (degrees, peak), their rate (Hz: a swing of 0.3 to
# 0.8 s, slower than 5 frames a second can sample twice a swing at the fast end), how long (s), how large
# the photo is drawn (its height / the frame's), a still head's sway (degrees, peak, any axis) and a
# glance's turn (degrees, once, either way).
NOD_DEG, SHAKE_DEG, RATE_HZ = (8.0, 20.0), (12.0, 30.0), (0.6, 1.4)
SECONDS, SCALE, STILL_DEG, GLANCE_DEG = (2.4, 3.6), (0.6, 1.0), 3.0, (15.0, 35.0)

RGB = npt.NDArray[np.uint8]


def photo(name: str = "astronaut_head.jpg") -> RGB:
    return np.asarray(Image.open(DATA / name).convert("RGB"))


@dataclass
class Head:
    """A face to turn: its photo and face mesh landmarks in pixels [468, 3] (x, y, depth), the pivots."""

    image: RGB
    points: npt.NDArray[np.float64]  # [468, 3]
    width: float  # the face's width in pixels (the landmarks' extent)
    _triangles: npt.NDArray[np.int32] | None = None  # see `triangles`

    def triangles(self, points: npt.NDArray[np.float64]) -> npt.NDArray[np.int32]:
        """The Delaunay triangles [T, 3] of the still points (with the ring and corners), made once."""
        if self._triangles is None:
            self._triangles = Delaunay(points).simplices.astype(np.int32)
        return self._triangles

    @classmethod
    def of(cls, image: RGB) -> Head:
        from models.vision.detect import import_mediapipe

        mp = import_mediapipe()
        with mp.solutions.face_mesh.FaceMesh(static_image_mode=True, max_num_faces=1) as mesh:
            res = mesh.process(image)
        if not res.multi_face_landmarks:
            raise ValueError("no face found in the photo to turn")
        h, w = image.shape[:2]
        lm = np.array([(p.x * w, p.y * h, p.z * w) for p in res.multi_face_landmarks[0].landmark])  # [468, 3]
        width = float(lm[:, 0].max() - lm[:, 0].min())
        return cls(image, lm, width)

    def turned(self, yaw_deg: float, pitch_deg: float) -> RGB:
        """The photo with the head turned by `yaw_deg` (+: to the picture's right) and `pitch_deg` (+: down)."""
        p = self.points
        centre = p.mean(axis=0)
        # A head turns about the neck: a pivot ~0.6 face widths behind the face's centre (yaw), and for a
        # nod also ~0.4 below it (pitch), so the face also moves a little, as a real one does.
        yaw_pivot = centre + np.array([0.0, 0.0, 0.6 * self.width])
        pitch_pivot = centre + np.array([0.0, 0.4 * self.width, 0.6 * self.width])
        a, b = np.radians(yaw_deg), np.radians(pitch_deg)
        ry = np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])
        rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
        q = (p - pitch_pivot) @ rx.T + pitch_pivot
        q = (q - yaw_pivot) @ ry.T + yaw_pivot  # [468, 3], z still depth (image y down, z away)
        # Fixed points: a ring around the face (its warp ends there) and the photo's corners.
        h, w = self.image.shape[:2]
        angles = np.linspace(0, 2 * np.pi, 24, endpoint=False)
        radius = 0.95 * self.width
        ring = np.stack([centre[0] + radius * np.cos(angles), centre[1] + 1.2 * radius * np.sin(angles)], 1)
        corners = np.array([[0, 0], [w - 1, 0], [0, h - 1], [w - 1, h - 1]], float)
        dst = np.concatenate([q[:, :2], ring, corners])  # where each point is drawn in the turned picture
        src = np.concatenate([p[:, :2], ring, corners])  # where its colour comes from
        x0, y0 = np.maximum(np.floor(ring.min(axis=0)).astype(int), 0)
        x1, y1 = np.minimum(np.ceil(ring.max(axis=0)).astype(int), [w - 1, h - 1])
        gx, gy = np.meshgrid(np.arange(x0, x1 + 1), np.arange(y0, y1 + 1))
        pixels = np.stack([gx.ravel(), gy.ravel()], 1).astype(np.float64)  # [P, 2]
        # Piecewise-linear through the turned points' triangles: each pixel's barycentric coordinates
        # in its triangle, applied to the same triangle's still points. Which triangle a pixel is in comes
        # from drawing them (scipy's find_simplex walk took up to 0.3 s a frame on some poses).
        # The still points' triangles, drawn where the turned points put them (one topology for every
        # pose: a fresh Delaunay a frame cost ~0.3-0.6 s on this machine, and small turns fold nothing).
        simplices = self.triangles(src)  # [T, 3]
        label = np.full(gx.shape, -1, np.int32)  # [h', w'] triangle index of each pixel
        corners16 = np.round((dst[simplices] - [x0, y0]) * 16).astype(np.int32)  # [T, 3, 2], 4 bits of subpixel
        for i, poly in enumerate(corners16):
            cv2.fillConvexPoly(label, poly, i, lineType=cv2.LINE_8, shift=4)
        simplex = label.ravel()  # [P], -1 outside every triangle
        ok = simplex >= 0
        tri = simplices[simplex[ok]]  # [P', 3] point indices of each pixel's triangle
        a, e1, e2 = dst[tri[:, 0]], dst[tri[:, 1]] - dst[tri[:, 0]], dst[tri[:, 2]] - dst[tri[:, 0]]  # [P', 2]
        d = pixels[ok] - a
        det = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]
        det = np.where(np.abs(det) < 1e-9, 1e-9, det)  # a triangle turned edge-on
        u = (d[:, 0] * e2[:, 1] - d[:, 1] * e2[:, 0]) / det
        v = (e1[:, 0] * d[:, 1] - e1[:, 1] * d[:, 0]) / det
        weights = np.stack([1 - u - v, u, v], axis=1)  # [P', 3] barycentric
        back = np.einsum("ni,nij->nj", weights, src[tri])  # [P', 2] source x, y
        map_x = np.tile(np.arange(w, dtype=np.float32), (h, 1))
        map_y = np.tile(np.arange(h, dtype=np.float32)[:, None], (1, w))
        px, py = pixels[ok, 0].astype(int), pixels[ok, 1].astype(int)
        map_x[py, px], map_y[py, px] = back[:, 0], back[:, 1]
        return np.asarray(cv2.remap(self.image, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE),
                          np.uint8)


@dataclass
class Clip:
    kind: str  # one of KINDS
    amplitude: float  # degrees, peak (the sway's, for a still head)
    rate: float  # Hz
    phase: float  # radians
    seconds: float
    scale: float  # the photo's height / the frame's
    offset: tuple[float, float]  # where the photo sits, as fractions of the room left (x, y)
    background: int  # index into `backgrounds()`

    def poses(self) -> list[tuple[float, float]]:
        """(yaw, pitch) in degrees at each frame."""
        out = []
        for i in range(round(self.seconds * FPS)):
            s = self.amplitude * np.sin(2 * np.pi * self.rate * i / FPS + self.phase)
            if self.kind == "nod":
                out.append((0.0, s))
            elif self.kind == "shake":
                out.append((s, 0.0))
            elif self.kind == "glance":  # aside and back once, over the clip, starting from a random point
                turn = np.sin(np.pi * min(1.0, max(0.0, i / (self.seconds * FPS - 1) * 1.4 - self.phase / 20)))
                out.append((self.amplitude * turn * (1 if self.rate > 0.7 * RATE_HZ[1] else -1), 0.0))
            else:  # a head at rest sways slowly on both axes, under a nod's or a shake's size
                out.append((s, self.amplitude * np.sin(2 * np.pi * self.rate * 0.7 * i / FPS + 2 * self.phase)))
        return out


def clips(n: int, seed: int) -> list[Clip]:
    """`n` clips of each kind, drawn from `seed`."""
    rng = np.random.default_rng(seed)
    out = []
    for kind in KINDS:
        for _ in range(n):
            lo, hi = {"nod": NOD_DEG, "shake": SHAKE_DEG, "still": (0.5, STILL_DEG), "glance": GLANCE_DEG}[kind]
            rate = rng.uniform(*RATE_HZ) * (0.3 if kind == "still" else 1.0)  # a sway is slow
            out.append(Clip(kind, float(rng.uniform(lo, hi)), float(rate), float(rng.uniform(0, 2 * np.pi)),
                            float(rng.uniform(*SECONDS)), float(rng.uniform(*SCALE)),
                            (float(rng.uniform()), float(rng.uniform())), int(rng.integers(0, 6))))
    return out


def backgrounds(seed: int = 0) -> list[RGB]:
    """Six rooms to stand in: two flat colours, two gradients, two noise textures (seeded)."""
    h, w = FRAME
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 1, h)[:, None, None]
    x = np.linspace(0, 1, w)[None, :, None]
    out = [np.full((h, w, 3), c, np.uint8) for c in ((200, 200, 195), (60, 70, 90))]
    out += [(np.array(a) * (1 - y) + np.array(b) * x).clip(0, 255).astype(np.uint8) * np.ones((1, w, 1), np.uint8)
            for a, b in (((230, 220, 200), (40, 30, 20)), ((40, 80, 120), (180, 160, 120)))]
    for k in (8, 32):
        small = rng.integers(40, 220, (h // k + 1, w // k + 1, 3)).astype(np.uint8)
        out.append(np.asarray(cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR), np.uint8))
    return out


def place(picture: RGB, scale: float, offset: tuple[float, float], room: RGB) -> RGB:
    """`picture` drawn `scale` of the frame's height tall, at `offset` within the room left, on `room`."""
    h, w = FRAME
    ph = max(8, round(h * scale))
    pw = max(8, round(picture.shape[1] * ph / picture.shape[0]))
    small = cv2.resize(picture, (pw, ph), interpolation=cv2.INTER_AREA)
    frame = room.copy()
    x = round((w - pw) * offset[0]) if pw <= w else 0
    y = round((h - ph) * offset[1]) if ph <= h else 0
    frame[y : y + min(ph, h), x : x + min(pw, w)] = small[: h - y, : w - x]
    return frame


def frames(head: Head, clip: Clip, rooms: list[RGB]) -> list[RGB]:
    """The clip's frames, [FRAME, 3] each."""
    return [place(head.turned(yaw, pitch), clip.scale, clip.offset, rooms[clip.background])
            for yaw, pitch in clip.poses()]


@dataclass
class Seen:
    """What the real detectors and the cascade's rules made of one clip."""

    clip: Clip
    cues: list[str]  # every cue that began, in order
    faces: int  # frames with a face found
    stopped: bool  # the rules stopped the assistant's speech (it was speaking all along)
    held: bool  # ... or held it as if the user had left

    @property
    def verdict(self) -> str:
        """"nod", "shake", "both" or "none"."""
        nod, shake = "nod" in self.cues, "shake" in self.cues
        return "both" if nod and shake else "nod" if nod else "shake" if shake else "none"

    @property
    def right(self) -> bool:
        return self.verdict == (self.clip.kind if self.clip.kind in ("nod", "shake") else "none")

    @property
    def kept_talking(self) -> bool:
        return not self.stopped and not self.held


def watch(head: Head, clip: Clip, rooms: list[RGB]) -> Seen:
    """Run the clip through a fresh session's detectors (models/vision/detect.py, as the worker runs them)
    and the cascade's rules on what they saw (models/cascade/sight.react) while the assistant speaks."""
    from models.cascade.sight import SightState, react
    from models.vision.detect import SessionDetectors

    det, state = SessionDetectors(), SightState()
    cues: list[str] = []
    faces, stopped, held = 0, False, False
    try:
        for i, frame in enumerate(frames(head, clip, rooms)):
            obs = det.observe(frame, i / FPS)
            faces += obs.face is not None
            began, stop = react(state, [obs], [], i, speaking=True)
            cues += began
            stopped, held = stopped or stop, held or state.away
    finally:
        det.close()
    return Seen(clip, cues, faces, stopped, held)
