"""A labelled picture set and visual questions, held out from what the vision rules were written against.

Each `Scene` is a 640x480 picture composed from the photos in tests/models/data (real photos, licences in
its README.md) and text drawn in fonts the tests never use (Liberation Serif, Mono and Sans Narrow, DejaVu
Serif and Sans Condensed; the tests' cards are DejaVu Sans Bold), with a question and the right answer.
`right(scene, facts)` judges the line of visual facts the reasoner was given (VisualState.describe), not
the reasoner's wording: whether what it needs to answer reached it.

32 questions, 22 of them about people. Kinds: is anyone there (a face or not: a person, a cat, a coffee
cup, a rocket, a bare room), is the person looking at the camera (facing, turned aside, looking down, in
profile), how many people, and what does the text say (lengths 2 to 31 characters, one or two lines, on
a card, on a photo, beside a face, tilted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from bench.vision.clips import FRAME, RGB, Head, backgrounds, photo, place

FONTS = "/usr/share/fonts/truetype"


@dataclass
class Scene:
    name: str
    picture: RGB  # [480, 640, 3]
    question: str
    present: bool | None = None  # someone in view (asked: is anyone there)
    facing: bool | None = None  # the person looks at the camera (asked: am I looking at the camera)
    people: int | None = None  # how many people (asked: how many)
    texts: list[str] = field(default_factory=list)  # the lines in view, top to bottom (asked: what does it say)


def _font(name: str, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.truetype(f"{FONTS}/{name}", size)
    except OSError:  # a machine without the font still runs, with a font the tests may know
        return ImageFont.load_default(size=size)


def card(lines: list[str], font: str, size: int, ink: str = "black", paper: str = "white",
         room: RGB | None = None, angle: float = 0.0, at: tuple[float, float] = (0.5, 0.5)) -> RGB:
    """`lines` drawn centred on a card (`paper`) on `room` (or filling the frame), turned by `angle` degrees,
    at `at` (fractions of the room left beside it)."""
    h, w = FRAME
    f = _font(font, size)
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    boxes = [tuple(round(v) for v in draw.textbbox((0, 0), line, font=f)) for line in lines]  # x0, y0, x1, y1
    tw = max(b[2] - b[0] for b in boxes) + 2 * size
    th = sum(b[3] - b[1] for b in boxes) + size * (len(lines) + 1)
    sign = Image.new("RGB", (tw, th), paper)
    d, y = ImageDraw.Draw(sign), size
    for line, b in zip(lines, boxes, strict=True):
        d.text(((tw - (b[2] - b[0])) // 2 - b[0], y - b[1]), line, fill=ink, font=f)
        y += b[3] - b[1] + size
    if angle:
        sign = sign.rotate(angle, expand=True, fillcolor=paper, resample=Image.Resampling.BICUBIC)
    if room is None:
        return np.asarray(sign.resize((w, h)) if sign.width > w else _on(sign, np.full((h, w, 3), 255, np.uint8)))
    return _on(sign, room, at)


def _on(sign: Image.Image, room: RGB, at: tuple[float, float] = (0.5, 0.5)) -> RGB:
    frame = Image.fromarray(room.copy())
    frame.paste(sign, (round((frame.width - sign.width) * at[0]), round((frame.height - sign.height) * at[1])))
    return np.asarray(frame)


def _photo_room(name: str) -> RGB:
    """A photo filling the frame."""
    h, w = FRAME
    return np.asarray(Image.fromarray(photo(name)).resize((w, h), Image.Resampling.LANCZOS))


def _people(head: RGB, n: int, room: RGB) -> RGB:
    """`n` copies of the head photo side by side (every other one mirrored), as a group would sit."""
    h, w = FRAME
    side = min(h, w // n)
    frame = room.copy()
    for i in range(n):
        face = head[:, ::-1] if i % 2 else head
        small = np.asarray(Image.fromarray(face).resize((side, side), Image.Resampling.LANCZOS))
        x, y = i * (w // n) + (w // n - side) // 2, (h - side) // 2
        frame[y : y + side, x : x + side] = small
    return frame


def scenes() -> list[Scene]:
    head_photo = photo()
    head = Head.of(head_photo)
    rooms = backgrounds(seed=7)  # not the clips' (seed 0)
    face = place(head_photo, 0.9, (0.5, 0.5), rooms[3])
    anyone, looking, many, says = ("Is anyone there?", "Am I looking at the camera?", "How many people are there?",
                                   "What does this say?")
    out = [
        Scene("face", face, anyone, present=True),
        Scene("face facing", face, looking, present=True, facing=True),
        Scene("turned right", place(head.turned(40, 0), 0.9, (0.4, 0.5), rooms[2]), looking, present=True,
              facing=False),
        Scene("turned left", place(head.turned(-40, 0), 0.9, (0.6, 0.5), rooms[5]), looking, present=True,
              facing=False),
        Scene("looking down", place(head.turned(0, 35), 0.9, (0.5, 0.4), rooms[0]), looking, present=True,
              facing=False),
        Scene("profile", place(photo("camera.jpg"), 1.0, (0.5, 0.5), rooms[1]), anyone, present=True),
        Scene("profile facing", place(photo("camera.jpg"), 1.0, (0.5, 0.5), rooms[1]), looking, present=True,
              facing=False),
        Scene("coffee", _photo_room("coffee.jpg"), anyone, present=False),
        Scene("cat", _photo_room("chelsea.jpg"), anyone, present=False),
        Scene("rocket", _photo_room("rocket.jpg"), anyone, present=False),
        Scene("bare room", rooms[4], anyone, present=False),
        Scene("one person", place(head_photo, 0.8, (0.3, 0.6), rooms[1]), many, people=1),
        Scene("two people", _people(head_photo, 2, rooms[0]), many, people=2),
        Scene("three people", _people(head_photo, 3, rooms[2]), many, people=3),
        Scene("serif word", card(["EXIT"], "liberation/LiberationSerif-Bold.ttf", 96), says, texts=["EXIT"]),
        Scene("mono phrase", card(["Mind the gap"], "liberation/LiberationMono-Bold.ttf", 56), says,
              texts=["Mind the gap"]),
        Scene("light on dark", card(["Back in 5 minutes"], "dejavu/DejaVuSerif.ttf", 48, "white", "#1c2c5a"), says,
              texts=["Back in 5 minutes"]),
        Scene("long narrow", card(["Deliveries at the rear entrance"], "liberation/LiberationSansNarrow-Regular.ttf",
                                  40), says, texts=["Deliveries at the rear entrance"]),
        Scene("two lines", card(["GATE 12", "BOARDING 14:35"], "dejavu/DejaVuSansCondensed-Bold.ttf", 60), says,
              texts=["GATE 12", "BOARDING 14:35"]),
        Scene("sign on a photo", card(["No entry"], "liberation/LiberationSans-Bold.ttf", 64, "white", "#b01010",
                                      room=_photo_room("coffee.jpg")), says, texts=["No entry"]),
        Scene("short", card(["B2"], "liberation/LiberationSans-Bold.ttf", 120), says, texts=["B2"]),
        Scene("tilted", card(["Platform 9"], "dejavu/DejaVuSerif-Bold.ttf", 64, room=rooms[3], angle=5), says,
              texts=["Platform 9"]),
        Scene("italic lower case", card(["please wait here"], "liberation/LiberationSerif-Italic.ttf", 60), says,
              texts=["please wait here"]),
        # the same pictures asked something else, and a few more of people (beyond reading signs)
        Scene("turned right, anyone", place(head.turned(40, 0), 0.9, (0.4, 0.5), rooms[2]), anyone, present=True),
        Scene("looking down, anyone", place(head.turned(0, 35), 0.9, (0.5, 0.4), rooms[0]), anyone, present=True),
        Scene("two people, anyone", _people(head_photo, 2, rooms[5]), anyone, present=True),
        Scene("small face", place(head_photo, 0.6, (0.15, 0.2), rooms[4]), looking, present=True, facing=True),
        Scene("small face, how many", place(head_photo, 0.6, (0.85, 0.8), rooms[1]), many, people=1),
        Scene("bare room, how many", rooms[1], many, people=0),
        Scene("rocket, how many", _photo_room("rocket.jpg"), many, people=0),
        Scene("two people again", _people(head_photo[:, ::-1], 2, rooms[3]), many, people=2),
        Scene("sign beside a face", card(["HELLO"], "liberation/LiberationMono-Bold.ttf", 44, room=face,
                                         at=(0.97, 0.9)), says, present=True, texts=["HELLO"]),
    ]
    return out


def right(scene: Scene, facts: str) -> dict[str, bool]:
    """Each fact the scene asks about: did the line given to the reasoner get it right?"""
    someone = "a person is in view" in facts or "people are in view" in facts
    out = {}
    if scene.present is not None:
        out["present"] = someone == scene.present
    if scene.facing is not None:
        out["facing"] = someone and ("looking at the camera" in facts) == scene.facing
    if scene.people is not None:
        out["people"] = (f"{scene.people} people are in view" in facts if scene.people > 1
                         else "a person is in view" in facts if scene.people == 1 else not someone)
    quoted = facts.split("text in view: ", 1)[1].rstrip(".") if "text in view: " in facts else ""
    if scene.texts:
        out["texts"] = quoted == "; ".join(f'"{t}"' for t in scene.texts)
    else:  # not what was asked, but text made up in a picture without any misleads the reasoner too
        out["no_text_made_up"] = not quoted
    return out
