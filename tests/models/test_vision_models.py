"""The real detectors on real pictures, in the real worker process (started once for the module).

tests/models/data/astronaut.jpg is scikit-image's `astronaut()` (Eileen Collins, a NASA photo in the
public domain) shrunk to 320x320. The text card is drawn here with PIL.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.vision.cost import text_card
from models.vision.tracker import Tracker
from models.vision.types import Observation
from models.vision.worker import VisionWorker

ASTRONAUT = Path(__file__).parent / "data" / "astronaut.jpg"


def astronaut() -> np.ndarray:
    return np.asarray(Image.open(ASTRONAUT).convert("RGB"))


card = text_card  # the bench measures OCR on the same card


@pytest.fixture(scope="module")
def worker():
    w = VisionWorker()
    yield w
    w.shutdown()


def _wait(worker: VisionWorker, sid: str, texts: bool = False, timeout: float = 60.0
          ) -> tuple[list[Observation], list[tuple[float, list[str]]]]:
    deadline = time.monotonic() + timeout
    obs: list[Observation] = []
    read: list[tuple[float, list[str]]] = []
    while time.monotonic() < deadline:
        o, r = worker.take(sid)
        obs += o
        read += r
        if obs and (read or not texts):
            return obs, read
        time.sleep(0.02)
    raise TimeoutError(f"the worker saw nothing of {sid} in {timeout}s")


def test_face_present_then_leaving_through_the_worker(worker: VisionWorker) -> None:
    tr = Tracker()
    cues: list[str] = []
    frames = [astronaut()] * 3 + [np.full((320, 320, 3), 90, np.uint8)] * 3  # she is there, then gone
    for i, frame in enumerate(frames):
        assert worker.submit("s1", frame, i * 0.2)
        assert not worker.submit("s1", frame, i * 0.2), "one frame in flight per session"
        (obs, _) = _wait(worker, "s1")
        for o in obs:
            cues += tr.update(o)
        if i == 2:
            assert tr.state.present and tr.state.facing, "a face looking at the camera"
            assert obs[-1].face is not None and abs(obs[-1].face.yaw) < 0.25
    assert not tr.state.present
    assert cues == ["left"]


def test_reads_a_card_and_nothing_on_a_photo(worker: VisionWorker) -> None:
    worker.submit("s2", card("OPEN 9 TO 5"), 0.0, read_text=True)
    _, read = _wait(worker, "s2", texts=True)
    assert read[0][1] == ["OPEN 9 TO 5"]
    worker.submit("s2", astronaut(), 0.2, read_text=True)
    _, read = _wait(worker, "s2", texts=True)
    assert read[0][1] == [], "no text made up in a photo without any"


def test_a_crashed_worker_leaves_sessions_blind_not_broken(caplog) -> None:
    w = VisionWorker()
    try:
        w.kill()
        deadline = time.monotonic() + 10
        while not w.dead and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w.dead
        assert not w.submit("s3", astronaut(), 0.0)
        assert w.take("s3") == ([], [])
        # The watcher thread marks the worker dead, then logs: the line may come a moment after `dead`.
        while "sessions go on without seeing" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "sessions go on without seeing" in caplog.text
    finally:
        w.shutdown()


def test_nod_shake_and_a_glance_on_a_real_face_turned_in_3d() -> None:
    """A real photo's face turned in 3-D (bench/vision/clips.py) through the real face mesh and the rules:
    a nod is a nod and it keeps talking, a shake is a shake, one look aside and back is neither."""
    from bench.vision.clips import Clip, Head, backgrounds, photo, watch

    head, rooms = Head.of(photo()), backgrounds()
    seen = {kind: watch(head, Clip(kind, amplitude, 1.0, 0.0, 1.6, 0.8, (0.5, 0.4), room), rooms)
            for kind, amplitude, room in (("nod", 12.0, 4), ("shake", 20.0, 2), ("glance", 25.0, 0))}
    assert all(s.faces == len(s.clip.poses()) for s in seen.values()), "the face is found in every frame"
    assert seen["nod"].verdict == "nod" and seen["nod"].kept_talking, seen["nod"]
    assert seen["shake"].verdict == "shake", seen["shake"]
    assert seen["glance"].verdict == "none", seen["glance"]


def test_held_out_scenes_give_the_reasoner_the_right_facts(worker: VisionWorker) -> None:
    """Three of bench/vision/scenes.py's held-out scenes through the worker to the facts line: two people
    counted, a cat's face not taken for a person, a phrase in a font the other tests never use read exactly."""
    from bench.vision.scenes import right, scenes

    chosen = {s.name: s for s in scenes() if s.name in ("two people", "cat", "mono phrase")}
    for i, (name, scene) in enumerate(chosen.items()):
        tr = Tracker()
        assert worker.submit(f"scene{i}", scene.picture, 0.0, read_text=True)
        obs, read = _wait(worker, f"scene{i}", texts=True)
        for o in obs:
            tr.update(o)
        tr.read(read[-1][1])
        facts = tr.state.describe()
        assert all(right(scene, facts).values()), (name, facts)
