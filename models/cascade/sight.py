"""What the cascade sees: camera frames to the vision worker, its observations to a per-session tracker,
and what that changes in a micro-turn.

The worker (models/vision/worker.py) starts with the first frame any session sends, so a server whose
clients never send video never starts it. Perception runs at the rate the worker keeps up with, at most
one frame per micro-turn per session (5 a second); OCR only when it can matter: the first frame, a new
scene (the picture changed a lot since the last reading), or a question (typed text, or a spoken turn
ending) while the camera is on. A question asked while a reading is on its way waits for it, at most
`READ_WAIT_TICKS`, so "what does this say?" is answered from the picture, not before it was read. The
first frame of a server's life waits for the worker to start (its imports and models, seconds): a
question asked meanwhile waits for that first reading, at most `START_WAIT_TICKS`, rather than going to
the reasoner with nothing seen.

A still picture (an `input_image` item, or any frame that comes after the camera was off and is not
followed by another before it is read) is part of the conversation: once read, its facts go to the
reasoner's context as a line of the conversation (the `vision` event with facts, which the server logs)
and its text is kept for the session, so a question about it minutes later, the camera on or not, is
answered from it. A camera stream's frames are not: only the newest one counts.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from models.base import Event
from models.cascade.grounding import INSTRUCTION, Facts
from models.cascade.text import words_of
from models.speech.speaker import Speaker
from models.vision.tracker import Tracker
from models.vision.types import Observation
from models.vision.worker import VisionWorker
from streaming.types import TICK_SECONDS

log = logging.getLogger(__name__)

READ_WAIT_TICKS = 8  # a question waits at most 1.6 s for the reading it asked for (OCR ~0.2-0.4 s)
START_WAIT_TICKS = 150  # ... and at most 30 s while the worker is still starting (a worker that never starts)
PICTURES_KEPT = 8  # still pictures whose text a session keeps for later questions
SCENE_CHANGE = 24.0  # mean absolute difference of 16x16 grey thumbnails (0-255) that counts as a new scene
CAMERA_GONE_TICKS = 10  # no frame for 2 s: the camera is off, and an answer held for the user's return goes on
STOP_CUES = ("open_palm", "raised_hand")  # while the assistant speaks: stop, like a spoken interruption
OFFER_WAIT_TICKS = 40  # an offer to go on that gets no reply in 8 s lapses: the held answer is dropped
# Replies to "shall I go on?": only these words says yes; a no ("no", "not now, thanks") says no; anything
# else is a new question, which supersedes the held answer as any question does.
GO_ON_WORDS = frozenset(["yes", "yeah", "yep", "yup", "sure", "ok", "okay", "please", "go", "on", "ahead", "continue",
                         "carry", "keep", "going", "right", "alright", "do", "it", "of", "course", "mm", "hmm", "mhm",
                         "uh", "huh"])
NO_WORDS = frozenset(["no", "nope", "nah", "stop", "don't", "never", "not", "mind", "now", "later", "thanks", "thank",
                      "you", "that's", "fine", "okay", "ok", "it", "please"])


def thumbnail(frame: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """A 16x16 grey thumbnail [16, 16] by block means: what 'the scene changed' is judged on.

    Every 4th pixel each way is plenty for 16x16 blocks, and keeps this to a fraction of a millisecond
    on the inference thread (all pixels, as float: ~8 ms for 640x480)."""
    h, w = frame.shape[:2]
    small = frame[: h - h % 64 : 4, : w - w % 64 : 4, 1].astype(np.float32)  # green ~ luma, [H/4, W/4]
    bh, bw = small.shape[0] // 16, small.shape[1] // 16
    if bh == 0 or bw == 0:
        return np.zeros((16, 16), np.float32)
    return small[: bh * 16, : bw * 16].reshape(16, bh, 16, bw).mean(axis=(1, 3))


@dataclass
class SightState:
    """One session's sight; every field is per session."""

    tracker: Tracker = field(default_factory=Tracker)  # visual state and cue onsets from observations
    frame: npt.NDArray[np.uint8] | None = None  # the newest frame seen (read again when a question comes)
    frame_tick: int = 0  # the micro-turn it came in
    read_thumb: npt.NDArray[np.float32] | None = None  # thumbnail of the frame OCR last ran on
    want_text: bool = False  # a reading is wanted at the next submit
    asked: int | None = None  # micro-turn a question asked for a reading; questions wait until it arrives
    held: list[str] = field(default_factory=list)  # questions waiting for that reading
    turn_read: bool = False  # the open user turn already asked for a reading
    away: bool = False  # the user left while the assistant spoke: its speech is held until they are back
    away_since: int = 0  # the micro-turn they left
    offer: bool = False  # they came back after a long absence: offer to go on (the cascade says it)
    offered: int | None = None  # the micro-turn it offered; the held answer waits for the user's reply
    reported: tuple[Any, ...] = (False, False, None, None, (), None, 0)  # the state last sent to the client
    ready_at: int | None = None  # the micro-turn this session first found the worker started
    still: int | None = None  # micro-turn of a still picture (a frame after the camera was off), until read
    picture_read: bool = False  # that picture's reading just arrived: its facts go into the conversation
    picture: bool = False  # the newest frame is a still picture (its facts say "Picture:", not "Camera:")
    pictures: list[tuple[str, ...]] = field(default_factory=list)  # text of the still pictures read, oldest first


class Sight:
    """The shared vision worker and the per-micro-turn rules on what it reports."""

    def __init__(self) -> None:
        self.worker: VisionWorker | None = None

    def look(self, sid: str, s: SightState, frame: npt.NDArray[np.uint8] | None, tick: int, question: bool) -> None:
        """Offer this micro-turn's frame (if any) to the worker; `question`: the user just asked something."""
        if frame is not None:
            if s.frame is None or tick - s.frame_tick > CAMERA_GONE_TICKS:
                s.want_text = True  # the first frame, or one after the camera was off: is there text in view?
                s.still, s.picture = tick, True  # a still picture, unless another frame follows before it is read
            else:
                s.still, s.picture = None, False  # a camera stream: only its newest frame counts
            s.frame, s.frame_tick = frame, tick
        elif s.away and tick - s.frame_tick > CAMERA_GONE_TICKS:
            s.away = False  # the camera went off while the user was away: nothing to wait for any more
        if s.frame is None:
            return  # no camera: nothing to read, questions do not wait
        if question:
            self.ask(s, tick)
        if s.want_text is False and frame is not None and s.read_thumb is not None:
            s.want_text = float(np.abs(thumbnail(frame) - s.read_thumb).mean()) > SCENE_CHANGE
        if frame is None and not s.want_text:
            return
        if self.worker is None:
            self.worker = VisionWorker()
        if self.worker.submit(sid, s.frame, tick * TICK_SECONDS, read_text=s.want_text):
            if s.want_text:
                s.read_thumb = thumbnail(s.frame)
            s.want_text = False
        elif self.worker.dead:
            s.asked = None  # blind: questions go on without a reading

    def ask(self, s: SightState, tick: int) -> bool:
        """A question (typed, or a spoken turn the cascade is about to delegate): read the newest frame
        and hold questions until that reading is back (at most `READ_WAIT_TICKS`); False without a camera
        or with a dead worker, when there is nothing to wait for. The frame goes to the worker at the next
        `look` (this micro-turn's frame is usually still being looked at)."""
        if s.frame is None or (self.worker is not None and self.worker.dead):
            return False
        s.want_text = True
        s.asked = tick if s.asked is None else s.asked
        return True

    def see(self, sid: str, s: SightState, tick: int, speaking: bool, offer_after: int | None = None
            ) -> tuple[list[str], bool]:
        """What the worker saw since the last micro-turn: (cues that began, stop speaking now)."""
        if self.worker is None:
            return [], False
        if s.ready_at is None and self.worker.ready:
            s.ready_at = tick
        observations, readings = self.worker.take(sid)
        return react(s, observations, readings, tick, speaking, offer_after)

    def facts(self, s: SightState) -> Facts:
        """What the picture and the camera showed, for checking an answer about them (grounding.py)."""
        st = s.tracker.state
        texts = st.texts or (s.pictures[-1] if s.pictures else ())
        kept = [f'"{t}"' for texts_ in s.pictures for t in texts_]
        line = st.describe() + (" Pictures shown earlier: " + "; ".join(kept) + "." if kept else "")
        return Facts(st.present, st.people, st.gesture, st.fingers, tuple(texts), line)


    def event(self, s: SightState, cues: list[str], facts: bool) -> Event | None:
        """A `vision` event when something began or the state changed; `facts`: with the line for the
        reasoner's context (the server logs it), sent just before a question goes to the reasoner."""
        st = s.tracker.state
        # the face box coarsely (a twentieth of the frame), so a client's overlay follows a moving face
        box = tuple(round(v * 20) for v in st.face_box) if st.face_box else None
        snapshot = (st.present, st.facing, st.gesture, st.fingers, st.texts, box, st.people)
        if not cues and snapshot == s.reported and not facts:
            return None
        s.reported = snapshot
        data: dict[str, Any] = {"cues": cues, "present": st.present, "people": st.people, "facing": st.facing,
                                "gesture": st.gesture,
                                "fingers": st.fingers, "texts": list(st.texts),
                                "face_box": [round(v, 3) for v in st.face_box] if st.face_box else None}
        if facts and st.frames:
            data["facts"] = f"{st.describe('Picture' if s.picture else 'Camera')} ({INSTRUCTION})"
        return Event("vision", data)

    def waiting(self, sid: str) -> list[Future[None]]:
        """The frame and the reading in flight: a media-pace step waits for them, so what is seen in
        media time does not depend on how fast the machine is."""
        return [] if self.worker is None else self.worker.waiting(sid)

    def close(self, sid: str) -> None:
        if self.worker is not None:
            self.worker.close_session(sid)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()


def reply_to_offer(words: str) -> str:
    """What the user's reply to "shall I go on?" says: "yes", "no", or "other" (a new question)."""
    ws = words_of(words)
    if ws and all(w in GO_ON_WORDS for w in ws):
        return "yes"
    said_no = any(w in ("no", "nope", "nah", "stop", "don't", "not", "never") for w in ws)
    return "no" if said_no and all(w in NO_WORDS for w in ws) else "other"


def offer_to_go_on(s: SightState, speaker: Speaker, phrase: str, tick: int) -> Event | None:
    """The user is back after a long absence with an answer held for them: ask before going on.

    The held answer stays queued and held (`s.offered`) and goes back to the start of the sentence it
    was cut in, so a "yes" hears it whole, not from mid-sentence; the offer is queued ahead of it as a
    backchannel is (it plays under the hold, and the user speaking cuts it)."""
    s.offer = False
    if not speaker.busy:
        return None  # nothing left to go on with
    if speaker.queue[0].kind != "backchannel":
        speaker.queue[0].pos = 0
    speaker.say(phrase, "backchannel")
    s.offered = tick
    return Event("resume_offer", {"away_s": round((tick - s.away_since) * TICK_SECONDS, 1), "text": phrase})


def react(s: SightState, observations: list[Observation], readings: list[tuple[float, list[str]]], tick: int,
          speaking: bool, offer_after: int | None = None) -> tuple[list[str], bool]:
    """The rules, on what the worker reported: (cues that began, stop speaking now). `speaking`: the
    assistant is saying an answer (not a backchannel). An open palm or a raised hand stops it; a nod is
    only a cue (it keeps talking); leaving mid-answer holds it (`s.away`) until the person is back; back
    after `offer_after` micro-turns or more, it is to offer to go on (`s.offer`) rather than go on."""
    cues: list[str] = []
    for obs in observations:
        cues += s.tracker.update(obs)
    # A reading answers a question only when it was asked for at or after the question: one asked when
    # a spoken turn began may be of a frame from before the sign was held up.
    answered = s.asked is not None and any(t >= s.asked * TICK_SECONDS - 1e-6 for t, _ in readings)
    for _, lines in readings:
        if s.tracker.read(lines) and s.tracker.state.texts:
            cues.append("text")
    if s.still is not None and any(t >= s.still * TICK_SECONDS - 1e-6 for t, _ in readings):
        s.still, s.picture_read = None, True  # the still picture is read: it joins the conversation
        s.pictures = [*s.pictures, s.tracker.state.texts][-PICTURES_KEPT:] if s.tracker.state.texts else s.pictures
    if s.asked is not None:
        # The wait counts from when the worker was found started: the first question of a server's
        # life waits for the first reading, not only for a reading's usual time.
        since = s.asked if s.ready_at is None else max(s.asked, s.ready_at)
        started = s.ready_at is not None
        if answered or (started and tick - since >= READ_WAIT_TICKS) or tick - s.asked >= START_WAIT_TICKS:
            s.asked = None
    if "left" in cues and speaking:
        s.away_since = tick if not s.away else s.away_since
        s.away = True
    if s.tracker.state.present and s.away:
        s.away = False
        s.offer = offer_after is not None and tick - s.away_since >= offer_after
    return cues, speaking and any(c in STOP_CUES for c in cues)
