"""Per-frame cost of each part of perception, on one core, in this process (as the worker runs them).

Each detector runs on the same frames: the face mesh and hands first on a fresh graph per frame
(static mode: a full detection every time) and then tracking (the worker's mode: one graph per session,
following the last frame's region); OCR on a drawn card and on a photo without text; decoding a client's
JPEG at the edge. Figures are medians and 90th percentiles in milliseconds.

    python -m bench.vision [--frames 30] [--image tests/models/data/astronaut.jpg] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from models.vision.detect import SessionDetectors, TextReader, import_mediapipe
from streaming.image import decode_image

ASTRONAUT = Path(__file__).resolve().parent.parent / "tests" / "models" / "data" / "astronaut.jpg"


def _times(fn: Callable[[], Any], n: int) -> dict[str, float]:
    fn()  # first call: lazy allocations
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": round(float(np.percentile(ts, 50)), 2), "p90_ms": round(float(np.percentile(ts, 90)), 2)}


def _card(text: str) -> np.ndarray:
    img = Image.new("RGB", (640, 480), "white")
    try:
        font: ImageFont.FreeTypeFont | ImageFont.ImageFont = ImageFont.truetype("DejaVuSans-Bold.ttf", 64)
    except OSError:
        font = ImageFont.load_default(size=64)
    ImageDraw.Draw(img).text((60, 180), text, fill="black", font=font)
    return np.asarray(img)


def run(frames: int, image: Path) -> dict[str, Any]:
    photo = np.asarray(Image.open(image).convert("RGB").resize((640, 480)))
    mp = import_mediapipe()
    fresh_face = mp.solutions.face_mesh.FaceMesh(static_image_mode=True, max_num_faces=1)
    fresh_hands = mp.solutions.hands.Hands(static_image_mode=True, max_num_hands=2, model_complexity=0)
    det = SessionDetectors()
    reader = TextReader()
    card = _card("OPEN 9 TO 5")
    buf = io.BytesIO()
    Image.fromarray(photo).save(buf, format="JPEG", quality=85)
    jpeg = buf.getvalue()
    out: dict[str, Any] = {"frame": [640, 480], "frames": frames, "cpus": os.cpu_count()}
    out["face_mesh_fresh"] = _times(lambda: fresh_face.process(photo), frames)
    out["face_mesh_tracking"] = _times(lambda: det.face.process(photo), frames)
    out["hands_lite_fresh"] = _times(lambda: fresh_hands.process(photo), frames)
    out["hands_lite_tracking"] = _times(lambda: det.hands.process(photo), frames)
    out["observe_tracking"] = _times(lambda: det.observe(photo, 0.0), frames)
    out["ocr_card"] = _times(lambda: reader.read(card), max(3, frames // 5))
    out["ocr_photo"] = _times(lambda: reader.read(photo), max(3, frames // 5))
    out["decode_jpeg_640x480"] = _times(lambda: decode_image(jpeg, 4096 * 4096, 640), frames)
    out["ocr_card_text"] = reader.read(card)
    out["ocr_photo_text"] = reader.read(photo)
    det.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--image", type=Path, default=ASTRONAUT)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(args.frames, args.image)
    if args.json:
        print(json.dumps(res))
        return
    for k, v in res.items():
        print(f"{k:24s} {v}")


if __name__ == "__main__":
    main()
