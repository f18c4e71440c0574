"""How soon the default voice reacts to what it sees while it speaks: the issue's visual-cue floors, measured
in process on the real cascade.

The default voice (`load_cascade("")`) with its real vision worker (mediapipe face mesh and hands in a
worker process), stepped in media pace as the server's media pace steps it (each micro-turn waits for the
off-thread work it uses: the frame being looked at, synthesis), speaks a long answer to a typed question
(streamed in by this bench, as a reasoner would). From a micro-turn drawn per trial on, the camera shows a
cue:

  leave  a real photo of a face (tests/models/data) standing in a room (bench/vision_clips.backgrounds),
         then the same room without the person: real pixels, real detectors, end to end.
  palm   the same person, and from the cue on an open palm or a raised hand. No photo of an open palm
         ships (tests/models/data/README.md), so the hand is INJECTED: 21 landmarks of an open hand join
         the worker's observation of every frame from the cue on, classified by the real gesture rule
         against the real detector's face, as models/vision/detect.py classifies a detected hand. This
         measures the rule and the cascade's reaction, not the hand detector: `detector()` measures that
         apart, on the real photos of hands (its per-frame cost, and whether a hand that comes into view
         is found on its first frame), and the estimate adds the two.
  nod    a nod clip of bench/vision_clips (a real face turned in 3-D), real detectors: does it keep talking?

Timing. Micro-turn k's input is [0.2k, 0.2k + 0.2) s and its output plays from 0.2(k + 1) (the server
steps k once that input is in). The camera takes a frame every 1/fps s from a phase drawn per trial; a
micro-turn sees the newest frame that arrived during it (`TickInput.video` holds one frame; the WebSocket
camera refuses more than 5 a second, WebRTC keeps the newest), so at 10 a second every other frame is never
looked at. latency = 0.2(j + 1) - c: c is when the first frame showing the cue was taken, j the first
micro-turn from which the output stays silent (`silent_s`), or the one reporting the decision (`yielded`
with `visual_stop`, the `left` cue: `event_s`). The cue's onset is drawn anywhere in a micro-turn;
`onset_s` also counts the wait for the camera's next frame.

`--pace realtime` steps at absolute deadlines and waits for nothing, as the server's real-time pace does (the
detectors' time on the clock: `wall_s`); `--sessions N` steps N - 1 more sessions with a camera on beside it.

    python -m bench.vision.reactions [--trials 20] [--seed 1] [--fps 5,10] [--kinds leave,palm,nod]
                                     [--pace media|realtime] [--sessions 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.vision.clips import Clip, Head, backgrounds, clips, frames, photo, place
from models.base import BackgroundChunk, TickInput, TickOutput, wait_work
from models.cascade import CascadeModel, load_cascade
from models.cascade.sight import STOP_CUES
from models.vision.gestures import classify
from models.vision.types import HandObs, Observation
from models.vision.worker import VisionWorker
from streaming.types import TICK_SAMPLES, TICK_SECONDS

RGB = npt.NDArray[np.uint8]
FLOORS = {"leave": 0.6, "palm": 0.4}  # seconds, the issue's
NOD_FLOOR = 0.9  # the issue's: keeps talking through a nod in >= 90 % of cases
# Real faces (public domain, tests/models/data) and how large each is drawn (its height / the frame's): the
# whole portrait's face is found from 0.9 of the frame up (at 0.6 it is too small for face mesh's detector).
PHOTOS = {"astronaut.jpg": (0.9, 1.0), "astronaut_head.jpg": (0.6, 1.0)}
HANDS = ("gesture_victory_03.jpg", "gesture_victory_10.jpg", "gesture_victory_28.jpg", "gesture_thumbs_up_17.jpg",
         "gesture_thumbs_up_38.jpg", "hand_pointing.jpg", "hand_fist.jpg", "hand_half_curl.jpg")  # real hands (MIT)
QUESTION = "Tell me about Paris."
ANSWER = ("Paris is the capital of France, on the river Seine. It is famous for the Eiffel Tower and the Louvre. "
          "In spring the weather is mild, with temperatures around fifteen degrees. Many visitors walk along the "
          "river in the evening. The city has twenty districts that spiral out from the centre. Its metro opened "
          "in nineteen hundred and carries millions of people every day.")
WATCH_TICKS = 8  # micro-turns after the cue's first frame in which a reaction counts
SILENT_RUN = 3  # the output stays silent this many micro-turns: it stopped (a sentence's gap is shorter)


@dataclass
class Trial:
    """One trial's draws: where the cue falls and what the camera shows."""

    kind: str  # "leave", "palm" or "nod"
    fps: float  # the camera's rate
    lead: int  # micro-turns into the answer at which the cue begins
    onset: float  # where in that micro-turn it begins (0-1)
    phase: float  # the camera's first frame, seconds (0 to 1/fps)
    room: int  # index into vision_clips.backgrounds()
    picture: str  # one of PHOTOS
    scale: float  # the photo's height / the frame's
    offset: tuple[float, float]  # where it stands in the room (fractions of the room left)
    hand: tuple[float, float]  # palm: the wrist's x, y (normalized)


@dataclass
class Reaction:
    trial: Trial
    silent_s: float | None  # first cue frame -> the output stays silent (None: it never did)
    event_s: float | None  # first cue frame -> the micro-turn that decided (`yielded` or `left`)
    onset_s: float | None  # the cue's onset -> the output stays silent (adds the camera's sampling gap)
    cues: list[str]  # every cue the cascade reported from the cue's frame on
    kept_talking: bool  # no stop and no hold (what a nod must give)
    seen_before: bool  # the person was in view (found by the detector) when the cue began; else void
    talking_before: bool  # the micro-turn before the cue's first frame was heard (it was speaking)
    wall_s: float | None = None  # real-time pace: first cue frame -> the step that went silent returned


def draw(kind: str, n: int, seed: int, fps: float) -> list[Trial]:
    rng = np.random.default_rng([seed, int(fps), len(kind)])
    out = []
    for _ in range(n):
        lead, onset, phase, room = int(rng.integers(1, 16)), rng.uniform(), rng.uniform(0, 1 / fps), rng.integers(0, 6)
        picture = list(PHOTOS)[int(rng.integers(0, len(PHOTOS)))]
        out.append(Trial(kind, fps, lead, float(onset), float(phase), int(room), picture,
                         float(rng.uniform(*PHOTOS[picture])), (float(rng.uniform()), float(rng.uniform())),
                         (float(rng.uniform(0.1, 0.9)), float(rng.uniform(0.3, 0.95)))))
    return out


def open_hand(wrist: tuple[float, float], scale: float = 0.14) -> npt.NDArray[np.float32]:
    """21 landmarks [21, 3] of an upright right hand, palm on, all five fingers out (mediapipe's order)."""
    wx, wy = wrist
    lm = np.zeros((21, 3), np.float32)
    lm[0, :2] = wrist
    for k, dx in enumerate((-0.3, -0.1, 0.1, 0.3)):  # index, middle, ring, pinky: base, two joints, tip
        for j, up in enumerate((1.0, 1.4, 1.7, 1.95)):
            lm[5 + 4 * k + j, :2] = (wx + dx * scale * (1 + 0.1 * j), wy - up * scale)
    for j, (dx, dy) in enumerate(((-0.3, -0.25), (-0.55, -0.45), (-0.75, -0.6), (-0.95, -0.75))):  # thumb out
        lm[1 + j, :2] = (wx + dx * scale, wy + dy * scale)
    return lm


class PalmWorker(VisionWorker):
    """The real vision worker; frames given for a session after `hold_up(sid, wrist)` are seen with an open
    hand at `wrist` as well (see the module's docstring: the palm is injected, the rest is detected)."""

    def __init__(self) -> None:
        super().__init__()
        self.wrist: dict[str, tuple[float, float]] = {}  # session -> where its hand is held up now
        self.marked: dict[tuple[str, float], tuple[float, float]] = {}  # (session, frame t) -> its hand
        self.aspect: dict[tuple[str, float], float] = {}  # ... and the frame's width / height

    def hold_up(self, sid: str, wrist: tuple[float, float] | None) -> None:
        if wrist is None:
            self.wrist.pop(sid, None)
        else:
            self.wrist[sid] = wrist

    def submit(self, sid: str, frame: RGB, t: float, read_text: bool = False) -> bool:
        ok = super().submit(sid, frame, t, read_text)
        if ok and sid in self.wrist:
            self.marked[(sid, round(t, 3))] = self.wrist[sid]
            self.aspect[(sid, round(t, 3))] = frame.shape[1] / frame.shape[0]
        return ok

    def take(self, sid: str) -> tuple[list[Observation], list[tuple[float, list[str]]]]:
        observations, texts = super().take(sid)
        for obs in observations:
            wrist = self.marked.pop((sid, round(obs.t, 3)), None)
            if wrist is not None:
                lm = open_hand(wrist)
                face_bottom = obs.face.box[3] if obs.face is not None else None
                gesture, fingers = classify(lm, face_bottom, self.aspect.pop((sid, round(obs.t, 3))))
                obs.hands.append(HandObs(landmarks=lm, gesture=gesture, fingers=fingers))
        return observations, texts


class Talk:
    """One session of `model`, stepped with a camera frame a micro-turn; answers its question with `ANSWER`,
    four words a micro-turn from two micro-turns after the `delegate` (a fast reasoner). Media pace waits for
    the work a micro-turn uses; `realtime` steps micro-turn n once its input is in (0.2(n + 1) s after the
    first) and waits for nothing, as the server's real-time pace does, so the detectors' time is on the clock."""

    def __init__(self, model: CascadeModel, name: str, realtime: bool = False, others: int = 0,
                 crowd: RGB | None = None) -> None:
        self.m, self.s = model, model.open(name)
        # `others` sessions stepped in the same batch, each sending `crowd` (a person) every micro-turn: the
        # one worker thread looks at their frames too. The measured session goes last, the worst place.
        self.others = [model.open(f"{name}-other-{i}") for i in range(others)]
        self.crowd = crowd
        self.realtime = realtime
        self.t0: float | None = None  # monotonic time micro-turn 0's input began (real-time pace)
        self.ends: list[float] = []  # when each step returned, seconds from t0 (real-time pace)
        self.outs: list[TickOutput] = []
        self.away: list[bool] = []  # the answer held for the user's return, after each micro-turn
        self.present: list[bool] = []  # a person in view (what the detectors reported), after each micro-turn
        self.pending: dict[int, list[BackgroundChunk]] = {}

    def step(self, frame: RGB | None, text: tuple[str, ...] = ()) -> TickOutput:
        n = len(self.outs)
        if self.realtime:  # at absolute deadlines: micro-turn n's input is all in at 0.2(n + 1)
            self.t0 = time.monotonic() if self.t0 is None else self.t0
            time.sleep(max(0.0, self.t0 + (n + 1) * TICK_SECONDS - time.monotonic()))
        else:
            wait_work(self.m, [self.s])  # the frame in flight, synthesis due: what media pace waits for
        tick = TickInput(np.zeros(TICK_SAMPLES, np.float32), TICK_SAMPLES, video=frame, text=list(text),
                         background=self.pending.pop(n, []))
        batch = [(o, TickInput(np.zeros(TICK_SAMPLES, np.float32), TICK_SAMPLES, video=self.crowd))
                 for o in self.others]
        out = self.m.step([*batch, (self.s, tick)])[-1]
        if any(e.type == "delegate" for e in out.events):
            words = ANSWER.split(" ")
            for k, i in enumerate(range(0, len(words), 4)):
                last = i + 4 >= len(words)
                chunk = BackgroundChunk(f"r{n}", n, " ".join(words[i : i + 4]) + ("" if last else " "), last)
                self.pending[n + 2 + k] = [chunk]
        self.outs.append(out)
        self.ends.append(time.monotonic() - (self.t0 or 0.0))
        self.away.append(self.s.sight.away)
        self.present.append(self.s.sight.tracker.state.present)
        return out

    def events(self, kind: str, since: int = 0) -> list[tuple[int, dict[str, Any]]]:
        return [(i, e.data) for i, o in enumerate(self.outs) if i >= since for e in o.events if e.type == kind]

    def close(self) -> None:
        for o in [*self.others, self.s]:
            self.m.close(o)


class Scene:
    """What the camera sees in a trial: the person in the room, then the cue; newest-frame delivery."""

    def __init__(self, trial: Trial, rooms: list[RGB], nod: tuple[Head, Clip] | None) -> None:
        self.t, self.room = trial, rooms[trial.room]
        self.shown = 0  # cue frames delivered so far (a nod clip's frame index)
        if trial.kind == "nod":
            assert nod is not None, "a nod trial turns a head: pass a vision_clips.Head and a nod Clip"
            head, clip = nod
            self.clip = frames(head, clip, rooms)
            self.person = place(head.image, clip.scale, clip.offset, rooms[clip.background])
        else:
            self.clip = []
            self.person = place(photo(trial.picture), trial.scale, trial.offset, self.room)

    def captures(self, k: int) -> list[float]:
        """When the camera took the frames that arrive during micro-turn k (s)."""
        period, t0 = 1 / self.t.fps, k * TICK_SECONDS
        m0 = int(np.ceil((t0 - self.t.phase) / period - 1e-9))
        return [self.t.phase + m * period for m in range(m0, m0 + 4) if self.t.phase + m * period < t0 + TICK_SECONDS]

    def frame(self, k: int, onset: float | None) -> tuple[RGB | None, bool]:
        """Micro-turn k's frame (the newest taken during it) and whether it shows the cue."""
        taken = self.captures(k)
        if not taken:
            return None, False
        cue = onset is not None and taken[-1] >= onset
        if not cue:
            return self.person, False
        if self.t.kind == "leave":
            return self.room, True
        self.shown += 1
        if self.t.kind == "nod":  # the clip's frames are 5 a second, one a micro-turn
            return (self.clip[self.shown - 1] if self.shown <= len(self.clip) else self.person), True
        return self.person, True


def run_trial(model: CascadeModel, trial: Trial, rooms: list[RGB], nod: tuple[Head, Clip] | None = None,
              name: str = "reaction", realtime: bool = False, others: int = 0) -> Reaction:
    """One trial on a fresh session: the question, the answer spoken `trial.lead` micro-turns, then the cue;
    `others`: that many more sessions with a camera on, stepped with it."""
    worker = model.sight.worker
    palm = worker if isinstance(worker, PalmWorker) else None
    if trial.kind == "palm" and palm is None:
        raise ValueError("a palm trial injects the hand: give the model a PalmWorker first "
                         "(model.sight.worker = PalmWorker(), before any frame)")
    scene = Scene(trial, rooms, nod)
    talk = Talk(model, name, realtime, others, place(photo("astronaut_head.jpg"), 0.8, (0.3, 0.5), rooms[3]))
    try:
        talk.step(scene.person)  # the camera on (the worker starts with the first frame)
        talk.step(scene.person, (QUESTION,))
        started = None
        for k in range(2, 80):  # the acknowledgment, then the answer's first words
            talk.step(scene.frame(k, None)[0])
            said = "".join(o.text for o in talk.outs)
            if started is None and "Paris is the capital" in said:
                started = k
            if started is not None and k - started >= trial.lead:
                break
        else:
            raise RuntimeError(f"the assistant never spoke the answer: {said!r}; is the cascade loaded with vision on?")
        onset = (len(talk.outs) + trial.onset) * TICK_SECONDS
        first = min(c for k in range(len(talk.outs), len(talk.outs) + 3) for c in scene.captures(k) if c >= onset)
        cue_tick = None
        end = len(talk.outs) + (len(scene.clip) + 3 if trial.kind == "nod" else WATCH_TICKS + SILENT_RUN)
        for k in range(len(talk.outs), end):
            frame, cue = scene.frame(k, onset)
            if cue and cue_tick is None:
                cue_tick = k
                if palm is not None and trial.kind == "palm":
                    palm.hold_up(talk.s.session_id, trial.hand)
            talk.step(frame)
        assert cue_tick is not None
        silent = next((j for j in range(cue_tick, end - SILENT_RUN + 1)
                       if all(talk.outs[i].silent for i in range(j, end))), None)
        decided = [i for i, d in talk.events("yielded", cue_tick) if d["reason"] == "visual_stop"]
        decided += [i for i, d in talk.events("vision", cue_tick) if "left" in d["cues"]]
        cues = [c for _, d in talk.events("vision", cue_tick) for c in d["cues"]]
        stopped = bool(talk.events("yielded", cue_tick)) or any(talk.away[cue_tick:])

        def since(j: int | None, t: float) -> float | None:
            return None if j is None else round((j + 1) * TICK_SECONDS - t, 3)

        return Reaction(trial, since(silent, first), since(min(decided, default=None), first), since(silent, onset),
                        cues, kept_talking=not stopped, seen_before=talk.present[cue_tick - 1],
                        talking_before=not talk.outs[cue_tick - 1].silent,
                        wall_s=round(talk.ends[silent] - first, 3) if realtime and silent is not None else None)
    finally:
        if palm is not None:
            palm.hold_up(talk.s.session_id, None)
        talk.close()


def detector() -> dict[str, Any]:
    """The hand detector on real photos of hands coming into view (tracking mode, as the worker runs it):
    on which frame it first finds the hand, and the worker's whole pass (face mesh and hands) on that frame
    (a fresh detection) and on the next three (tracking)."""
    from models.vision.detect import SessionDetectors

    rooms = backgrounds()
    first: list[int | None] = []  # per photo: the frame its hand was first found on (0: as it came in view)
    fresh: list[float] = []
    tracking: list[float] = []
    for i, name in enumerate(HANDS):
        room, det = rooms[i % len(rooms)], SessionDetectors()
        try:
            for k in range(3):
                det.observe(room, k * TICK_SECONDS)  # an empty room first: nothing to track
            shown = place(photo(name), 0.9, (0.5, 0.5), room)
            found = None
            for k in range(4):
                t0 = time.perf_counter()
                obs = det.observe(shown, (3 + k) * TICK_SECONDS)
                (fresh if k == 0 else tracking).append((time.perf_counter() - t0) * 1000)
                if obs.hands and found is None:
                    found = k
            first.append(found)
        finally:
            det.close()
    return {"photos": len(HANDS), "found_on_first_frame": sum(f == 0 for f in first),
            "found_later": sum(f is not None and f > 0 for f in first),
            "never_found": [name for name, f in zip(HANDS, first, strict=True) if f is None],
            "first_frame_ms": _pcts(fresh, 1), "next_frames_ms": _pcts(tracking, 1)}


def _pcts(xs: list[float], digits: int = 3) -> dict[str, float]:
    return {q: round(float(np.percentile(xs, p)), digits) for q, p in (("p50", 50), ("p90", 90), ("max", 100))}


def summarize(kind: str, rs: list[Reaction]) -> dict[str, Any]:
    """p50 / p90 / max of the latencies (leave, palm) or how often it kept talking (nod), over the trials
    whose person the detector had found before the cue (the others are void and counted)."""
    out: dict[str, Any] = {"trials": len(rs), "void_not_seen_before": sum(not r.seen_before for r in rs),
                           "silent_before_cue": sum(not r.talking_before for r in rs)}
    rs = [r for r in rs if r.seen_before]
    if kind == "nod":
        out["kept_talking"] = round(sum(r.kept_talking for r in rs) / len(rs), 3)
        out["nod_seen"] = sum("nod" in r.cues for r in rs)
        out["floor"] = NOD_FLOOR
        return out
    for key in ("silent_s", "event_s", "onset_s", "wall_s"):
        xs = [getattr(r, key) for r in rs]
        if key == "wall_s" and all(x is None for x in xs):
            continue  # media pace: no wall clock to report
        out[key] = _pcts([x for x in xs if x is not None]) if any(x is not None for x in xs) else None
        out[f"{key}_missing"] = sum(x is None for x in xs)
    out["floor_s"] = FLOORS[kind]
    out["within_floor"] = sum(r.silent_s is not None and r.silent_s <= FLOORS[kind] + 1e-9 for r in rs)
    if kind == "palm":
        out["cue"] = {c: sum(c in r.cues for r in rs) for c in STOP_CUES}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20, help="trials of each kind (and camera rate)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fps", default="5,10", help="camera rates for leave and palm (nods: 5, the clips' rate)")
    ap.add_argument("--kinds", default="leave,palm,nod")
    ap.add_argument("--sessions", type=int, default=1,
                    help="sessions with a camera on, stepped together (the measured one last in the batch)")
    ap.add_argument("--pace", choices=("media", "realtime"), default="media",
                    help="realtime: steps at absolute deadlines and waits for nothing (the detectors on the clock)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rates = [float(f) for f in args.fps.split(",")]
    kinds = args.kinds.split(",")
    if unknown := set(kinds) - {"leave", "palm", "nod"}:
        sys.exit(f"--kinds: unknown {sorted(unknown)}; use leave, palm and/or nod")
    t0 = time.monotonic()
    print("loading the default cascade ...", file=sys.stderr, flush=True)
    model = load_cascade("")
    model.sight.worker = PalmWorker()  # the real worker, able to add an open hand (palm trials only)
    rooms = backgrounds()
    head = Head.of(photo()) if "nod" in kinds else None
    res: dict[str, Any] = {"seed": args.seed, "pace": args.pace, "sessions": args.sessions}
    try:
        if "leave" in kinds or "palm" in kinds:
            res["detector"] = detector()
        plan = [(kind, fps) for kind in kinds for fps in (rates if kind != "nod" else [5.0])]
        for kind, fps in plan:
            rs = []
            nods = [c for c in clips(args.trials, args.seed) if c.kind == "nod"]  # bench.vision --motion's
            for i, trial in enumerate(draw(kind, args.trials, args.seed, fps)):
                nod = (head, nods[i]) if head is not None and kind == "nod" else None
                rs.append(run_trial(model, trial, rooms, nod, f"{kind}-{fps:g}-{i}", args.pace == "realtime",
                                    args.sessions - 1))
                r = rs[-1]
                print(f"[{kind} {fps:g} fps {i + 1}/{args.trials}] lead {trial.lead} phase {trial.phase:.3f}: silent "
                      f"{r.silent_s} s (wall {r.wall_s}), decided {r.event_s} s, kept talking {r.kept_talking}, "
                      f"cues {r.cues}"
                      f"{'' if r.seen_before else ' (void: nobody seen before the cue)'}, "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            res[f"{kind}_{fps:g}fps"] = summarize(kind, rs)
        if "palm" in kinds and "detector" in res:
            fresh = res["detector"]["first_frame_ms"]["p90"] / 1000  # added as if serial: an upper estimate
            res["palm_estimate_s"] = {f"{fps:g}fps": round(res[f"palm_{fps:g}fps"]["silent_s"]["max"] + fresh, 3)
                                      for fps in rates if res[f"palm_{fps:g}fps"]["silent_s"]}
    finally:
        model.shutdown()
    if args.json:
        print(json.dumps(res))
        return
    for k, v in res.items():
        print(f"{k:16s} {v}")


if __name__ == "__main__":
    main()
