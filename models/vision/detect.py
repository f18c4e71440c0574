"""The detectors on one frame: mediapipe face mesh and hands (tracking per session), rapidocr for text.

Runs inside the vision worker process (worker.py), never in the server's. Each session has its own
face mesh and hands graphs, because mediapipe tracks between frames (the landmark model follows the
last frame's region: ~3 ms a face instead of a fresh detection); the OCR engine is shared and stateless.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import numpy as np
import numpy.typing as npt

from models.vision.gestures import classify
from models.vision.head import head_pose
from models.vision.types import FaceObs, HandObs, Observation

MAX_FACES = 4  # faces the mesh looks for (the count reaches the reasoner; the largest is the user)
OCR_SIDE = 480  # the text detector's longest side: ~200 ms a frame on one core
OCR_MIN_SCORE = 0.8  # below this a reading is dropped ...
OCR_MIN_SCORE_SHORT = 0.95  # ... and a reading of under 3 characters needs this (a lone "8" in a photo)


def import_mediapipe() -> types.ModuleType:
    """mediapipe 0.10.21's package __init__ imports its drawing helpers, which import matplotlib; the
    detectors never draw, so without matplotlib an empty stand-in is enough (it saves a 40 MB install)."""
    os.environ.setdefault("GLOG_minloglevel", "2")  # its C++ INFO/WARNING lines on every graph start
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import matplotlib.pyplot  # noqa: F401
    except ImportError:
        for name in ("matplotlib", "matplotlib.pyplot"):
            sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules["matplotlib"].pyplot = sys.modules["matplotlib.pyplot"]  # type: ignore[attr-defined]
    import mediapipe

    return mediapipe


class SessionDetectors:
    """One session's face mesh and hands graphs (they track between its frames)."""

    def __init__(self) -> None:
        mp = import_mediapipe()
        # Up to MAX_FACES, so "how many people are there?" has an answer; the pose is the largest face's
        # (the nearest: the user). Tracking one face while allowing more runs the face detector on every
        # frame (~2 ms at 640x480), which is part of the per-frame figures bench.vision reports.
        self.face = mp.solutions.face_mesh.FaceMesh(static_image_mode=False, max_num_faces=MAX_FACES,
                                                    min_detection_confidence=0.5, min_tracking_confidence=0.5)
        self.hands = mp.solutions.hands.Hands(static_image_mode=False, max_num_hands=2, model_complexity=0,
                                              min_detection_confidence=0.5, min_tracking_confidence=0.5)

    def observe(self, rgb: npt.NDArray[np.uint8], t: float) -> Observation:
        """RGB [H, W, 3] -> the face (pose) and hands (gesture, fingers) in it."""
        assert rgb.ndim == 3 and rgb.shape[2] == 3 and rgb.dtype == np.uint8, f"expected RGB uint8, got {rgb.shape}"
        aspect = rgb.shape[1] / rgb.shape[0]  # landmarks are normalized by width (x) and height (y)
        face = None
        res = self.face.process(rgb)
        found = res.multi_face_landmarks or []
        if found:
            meshes = [np.array([(p.x, p.y, p.z) for p in f.landmark], np.float32) for f in found]  # [468, 3] each
            lm = max(meshes, key=lambda m: float(np.ptp(m[:, 0]) * np.ptp(m[:, 1])))  # the largest: the user
            yaw, pitch = head_pose(lm, aspect)
            box = (float(lm[:, 0].min()), float(lm[:, 1].min()), float(lm[:, 0].max()), float(lm[:, 1].max()))
            face = FaceObs(box=box, yaw=yaw, pitch=pitch)
        hands = []
        res = self.hands.process(rgb)
        # The world landmarks (metric 3-D, the hand's own shape) come in the same order: the finger rules'
        # angles are taken on them (gestures.py).
        worlds = res.multi_hand_world_landmarks or [None] * len(res.multi_hand_landmarks or [])
        for hand, world in zip(res.multi_hand_landmarks or [], worlds, strict=True):
            lm = np.array([(p.x, p.y, p.z) for p in hand.landmark], np.float32)  # [21, 3]
            w = None if world is None else np.array([(p.x, p.y, p.z) for p in world.landmark], np.float32)  # [21, 3]
            gesture, fingers = classify(lm, face.box[3] if face else None, aspect, w)
            hands.append(HandObs(landmarks=lm, gesture=gesture, fingers=fingers))
        return Observation(t=t, face=face, hands=hands, people=len(found))

    def close(self) -> None:
        self.face.close()
        self.hands.close()


class TextReader:
    """rapidocr (PP-OCR det + rec, no angle classifier) on one thread."""

    def __init__(self) -> None:
        import logging

        from rapidocr import RapidOCR

        logging.getLogger("RapidOCR").setLevel(logging.WARNING)
        self.engine = RapidOCR(params={"Det.limit_side_len": OCR_SIDE, "Global.use_cls": False,
                                       "Global.log_level": "warning",
                                       "EngineConfig.onnxruntime.intra_op_num_threads": 1,
                                       "EngineConfig.onnxruntime.inter_op_num_threads": 1})

    def read(self, rgb: npt.NDArray[np.uint8]) -> list[str]:
        """The text lines read with confidence, top to bottom."""
        out: Any = self.engine(rgb)  # RapidOCROutput (its declared return type is a union of stages)
        if out.txts is None:
            return []
        lines = []
        for text, score, box in zip(out.txts, out.scores, out.boxes, strict=True):
            text = text.strip()
            short = len(text.replace(" ", "")) < 3
            if text and score >= (OCR_MIN_SCORE_SHORT if short else OCR_MIN_SCORE):
                lines.append((float(np.mean(np.asarray(box)[:, 1])), text))
        return [text for _, text in sorted(lines)]
