"""Per-frame cost of each part of perception, on one core, in this process (as the worker runs them).

Each detector runs on the same frames: the face mesh and hands first on a fresh graph per frame
(static mode: a full detection every time) and then tracking (the worker's mode: one graph per session,
following the last frame's region); OCR on a drawn card and on a photo without text; decoding a client's
JPEG at the edge. Figures are medians and 90th percentiles in milliseconds.

    python -m bench.vision [--frames 30] [--image tests/models/data/astronaut.jpg] [--json]

`--answers N`: visual questions through a real server (`duplex serve --model cascade:classic`, its
default background reasoner): N sessions each send a drawn sign as an `input_image` with "What does the
sign say?" and step in media pace until the reasoner's answer is done; then N/4 ask "Is anyone looking
at the camera?" of the astronaut or of an empty grey frame. Reported: how often the right facts reached
the reasoner (the vision event's facts) and how often its answer is right.

`--motion N [--seed S]`: N clips each of a head nodding, shaking, holding still and glancing aside once,
made from a real photo turned in 3-D (bench/vision/clips.py: amplitude, rate, phase, length, scale,
position and background drawn from the seed), through the real detectors and the cascade's rules while
it speaks. Reported per kind: how often the right cue (or none) was seen, and on nods how often it kept
talking (no stop, no hold). The rules' thresholds were set before seed 0's clips were first run; report
on another seed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from models.vision.detect import SessionDetectors, TextReader, import_mediapipe
from streaming.image import decode_image

ASTRONAUT = Path(__file__).resolve().parents[2] / "tests" / "models" / "data" / "astronaut.jpg"


def _times(fn: Callable[[], Any], n: int) -> dict[str, float]:
    fn()  # first call: lazy allocations
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": round(float(np.percentile(ts, 50)), 2), "p90_ms": round(float(np.percentile(ts, 90)), 2)}


def text_card(text: str) -> np.ndarray:
    """A 640x480 white card with `text` in 64-px bold letters: what OCR is measured (and tested) on."""
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
    card = text_card("OPEN 9 TO 5")
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


SIGNS = ("EXIT", "OPEN 9 TO 5", "NO PARKING", "PUSH", "PULL", "CAFE", "TAXI", "STOP", "SALE", "PLATFORM 3",
         "ROOM 204", "WET FLOOR", "BUS STOP", "KEEP LEFT", "HOTEL", "POLICE", "PHARMACY", "FIRE EXIT", "LIBRARY",
         "BAKERY")


def _words(text: str) -> str:
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text.lower()).split())


async def _ask(ws_url: str, picture: np.ndarray, question: str, answer_too: bool = True
               ) -> tuple[str, str | None, float]:
    """(the facts line the reasoner got, its answer, seconds) for one picture and question; without
    `answer_too`, once the facts are out (the answer is then None)."""
    from bench.wsclient import open_session, send, set_session

    buf = io.BytesIO()
    Image.fromarray(picture).save(buf, format="JPEG", quality=85)
    url = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    facts, answer, t0 = "", None, time.monotonic()
    async with open_session(ws_url) as ws:
        await set_session(ws, pace="media")
        content = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": question}]
        await send(ws, {"type": "conversation.item.create",
                        "item": {"type": "message", "role": "user", "content": content}})
        for _ in range(400):  # micro-turns of silence until the answer is done
            await ws.send(bytes(9600))
            while True:
                ev = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if ev["type"] == "duplex.event" and ev["event"] == "vision" and ev["data"].get("facts"):
                    facts = ev["data"]["facts"]
                if ev["type"] == "duplex.background.done":
                    answer = ev.get("text", "")
                if ev["type"] == "response.output_audio.delta":
                    break
            if answer is not None or (facts and not answer_too):
                break
    return facts, answer, round(time.monotonic() - t0, 2)


async def _ask_sign(ws_url: str, sign: str) -> dict[str, Any]:
    facts, answer, seconds = await _ask(ws_url, text_card(sign), "What does the sign say?")
    return {"sign": sign, "facts": facts, "answer": answer, "seconds": seconds,
            "read": f'"{sign}"' in facts, "said": _words(sign) in _words(answer or "")}


async def _ask_person(ws_url: str, photo: np.ndarray, there: bool) -> dict[str, Any]:
    """Someone there (the astronaut, facing the camera) or nobody (a grey frame): is the answer right?"""
    facts, answer, seconds = await _ask(ws_url, photo if there else np.full_like(photo, 90),
                                        "Is anyone looking at the camera? Answer yes or no.")
    words = _words(answer or "").split()
    return {"person": there, "facts": facts, "answer": answer, "seconds": seconds,
            "read": ("looking at the camera" in facts) == there,
            "said": ("yes" in words) == there and ("no" in words or "nobody" in words) != there}


def answers(n: int) -> dict[str, Any]:
    from bench._server import local_server

    with local_server("--model", "cascade:classic") as base:
        ws_url = base.replace("http", "ws", 1) + "/v1/realtime"
        results = [asyncio.run(_ask_sign(ws_url, SIGNS[i % len(SIGNS)])) for i in range(n)]
        photo = np.asarray(Image.open(ASTRONAUT).convert("RGB").resize((640, 480)))
        people = [asyncio.run(_ask_person(ws_url, photo, i % 2 == 0)) for i in range(max(2, n // 4))]
    return {"questions": n, "text_reached_reasoner": sum(r["read"] for r in results) / n,
            "answer_says_text": sum(r["said"] for r in results) / n,
            "person_facts_right": sum(r["read"] for r in people) / len(people),
            "person_answer_right": sum(r["said"] for r in people) / len(people), "results": results + people}


def questions() -> dict[str, Any]:
    """The held-out scenes (bench/vision/scenes.py) through a real server: each picture with its question,
    judged on the facts line the reasoner is given."""
    from bench._server import local_server
    from bench.vision.scenes import right, scenes

    todo = scenes()
    results: list[dict[str, Any]] = []
    with local_server("--model", "cascade:classic") as base:
        ws_url = base.replace("http", "ws", 1) + "/v1/realtime"
        for k, scene in enumerate(todo):
            facts, _, seconds = asyncio.run(_ask(ws_url, scene.picture, scene.question, answer_too=False))
            verdicts = right(scene, facts)
            results.append({"scene": scene.name, "question": scene.question, "facts": facts, "seconds": seconds,
                            "right": verdicts})
            print(f"[{k + 1}/{len(todo)}] {scene.name}: {verdicts} {facts!r}", file=sys.stderr, flush=True)
    asked = ("present", "facing", "people", "texts")  # what the questions ask; no_text_made_up is extra
    out: dict[str, Any] = {"questions": len(results),
                           "answered_right": sum(all(v for k, v in r["right"].items() if k in asked) for r in results)}
    for kind in (*asked, "no_text_made_up"):
        judged = [r["right"][kind] for r in results if kind in r["right"]]
        out[f"{kind}_right"] = f"{sum(judged)}/{len(judged)}"
    out["wrong"] = [r for r in results if not all(r["right"].values())]  # made-up text included
    return out


def motion(n: int, seed: int) -> dict[str, Any]:
    from bench.vision.clips import KINDS, Head, backgrounds, clips, photo, watch

    head, rooms = Head.of(photo()), backgrounds()
    t0, seen = time.monotonic(), []
    todo = clips(n, seed)
    for k, clip in enumerate(todo):
        seen.append(watch(head, clip, rooms))
        print(f"[{k + 1}/{len(todo)}] {clip.kind}: {seen[-1].verdict}, {time.monotonic() - t0:.0f} s", file=sys.stderr,
              flush=True)
    out: dict[str, Any] = {"clips_per_kind": n, "seed": seed}
    for kind in KINDS:
        mine = [s for s in seen if s.clip.kind == kind]
        out[f"{kind}_right"] = round(sum(s.right for s in mine) / len(mine), 3)
        out[f"{kind}_seen_as"] = {v: sum(s.verdict == v for s in mine) for v in ("nod", "shake", "both", "none")}
    nods = [s for s in seen if s.clip.kind == "nod"]
    out["nod_kept_talking"] = round(sum(s.kept_talking for s in nods) / len(nods), 3)
    out["frames_with_face"] = round(sum(s.faces for s in seen) / sum(len(s.clip.poses()) for s in seen), 3)
    out["wrong"] = [{"kind": s.clip.kind, "seen": s.verdict, "amplitude": round(s.clip.amplitude, 1),
                     "rate": round(s.clip.rate, 2), "scale": round(s.clip.scale, 2)} for s in seen if not s.right]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--image", type=Path, default=ASTRONAUT)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--answers", type=int, default=0, help="N visual questions through a real server instead")
    ap.add_argument("--motion", type=int, default=0, help="N head-motion clips of each kind instead")
    ap.add_argument("--seed", type=int, default=1, help="--motion's clips (0 is the set the rules were checked on)")
    ap.add_argument("--questions", action="store_true", help="the held-out scenes' questions through a real server")
    args = ap.parse_args()
    if args.questions:
        res = questions()
    elif args.motion:
        res = motion(args.motion, args.seed)
    else:
        res = answers(args.answers) if args.answers else run(args.frames, args.image)
    if args.json:
        print(json.dumps(res))
        return
    for k, v in res.items():
        print(f"{k:24s} {v}")


if __name__ == "__main__":
    main()
