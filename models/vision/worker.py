"""The detectors in a separate process: their GIL time and a crash stay out of the conversation.

The caller (the cascade, on the inference thread) `submit`s a session's frame and later `take`s what was
seen; neither call waits. A session has at most one frame in flight: a frame offered while the last
is still being looked at is skipped, so a slow worker lowers the perception rate instead of queueing.
Inside the worker, face and hands run on one thread and OCR on another (one thread per model), so a
200 ms reading never delays the 10 ms landmark pass. If the worker dies, every session goes on blind:
`submit` returns False, one warning is logged, nothing raises.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from models.vision.types import Observation

log = logging.getLogger(__name__)

WORKER_NICE = 10  # added to the worker process's niceness (see _main)


@dataclass
class _Inbox:
    observations: list[Observation] = field(default_factory=list)
    texts: list[tuple[float, list[str]]] = field(default_factory=list)
    in_flight: bool = False
    seen: Future[None] | None = None  # done when the frame in flight has been looked at
    reading: Future[None] | None = None  # done when the reading asked last has arrived
    errors: int = 0  # frames the worker failed on


class VisionWorker:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")  # the server has threads: a forked copy of them could deadlock
        self._requests: Any = ctx.Queue()
        self._results: Any = ctx.Queue()
        self._proc = ctx.Process(target=_main, args=(self._requests, self._results), name="duplex-vision",
                                 daemon=True)
        self._proc.start()
        self._lock = threading.Lock()
        self._sessions: dict[str, _Inbox] = {}
        self._stopping = False
        self.dead = False  # the worker process is gone: every session is blind
        self.ready = False  # the worker has read a frame (or failed on one): its models are loaded and run
        self._reader = threading.Thread(target=self._read, name="vision-results", daemon=True)
        self._reader.start()

    def submit(self, sid: str, frame: npt.NDArray[np.uint8], t: float, read_text: bool = False) -> bool:
        """Look at `frame` (RGB [H, W, 3]) for session `sid`; False: skipped (one in flight, or no worker)."""
        with self._lock:
            box = self._sessions.setdefault(sid, _Inbox())
            if self.dead or box.in_flight:
                return False
            box.in_flight = True
            box.seen = Future()
            if read_text:
                box.reading = Future()
        self._requests.put(("frame", sid, t, np.ascontiguousarray(frame), read_text))
        return True

    def waiting(self, sid: str) -> list[Future[None]]:
        """What is still being worked on for `sid` (a media-pace step waits for it: models.base.OffThreadWork)."""
        with self._lock:
            box = self._sessions.get(sid)
            return [] if box is None else [f for f in (box.seen, box.reading) if f is not None and not f.done()]

    def busy(self, sid: str) -> bool:
        with self._lock:
            box = self._sessions.get(sid)
            return box is not None and box.in_flight and not self.dead

    def take(self, sid: str) -> tuple[list[Observation], list[tuple[float, list[str]]]]:
        """What was seen since the last call: observations, and (t, lines) for each OCR reading."""
        with self._lock:
            box = self._sessions.get(sid)
            if box is None:
                return [], []
            obs, texts = box.observations, box.texts
            box.observations, box.texts = [], []
            return obs, texts

    def close_session(self, sid: str) -> None:
        with self._lock:
            self._sessions.pop(sid, None)
        if not self.dead:
            self._requests.put(("close", sid))

    def shutdown(self) -> None:
        self._stopping = True
        if self._proc.is_alive():
            self._requests.put(("stop",))
            self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        with contextlib.suppress(OSError, ValueError):
            self._results.put(None)  # the reader stops now, not at its next poll (up to 0.5 s)
        self._reader.join(timeout=5)

    def kill(self) -> None:
        """Kill the worker as a crash would (tests: the sessions must go on blind)."""
        self._proc.kill()

    def _read(self) -> None:
        while True:
            try:
                msg = self._results.get(timeout=0.5)
            except queue.Empty:
                if not self._proc.is_alive():
                    break
                continue
            except (EOFError, OSError):
                break
            if msg is None:  # shutdown: the worker has exited
                break
            kind, sid = msg[0], msg[1]
            if kind == "fatal":
                log.warning("vision worker cannot run its detectors: %s", msg[2])
                continue
            with self._lock:
                box = self._sessions.get(sid)
                if box is None:
                    continue
                if kind in ("text", "error"):
                    self.ready = True
                if kind == "obs":
                    box.observations.append(msg[2])
                    box.in_flight = False
                    _resolve(box.seen)
                elif kind == "text":
                    box.texts.append((msg[2], msg[3]))
                    _resolve(box.reading)
                elif kind == "error":
                    box.in_flight = False
                    _resolve(box.seen)
                    _resolve(box.reading)
                    box.errors += 1
                    if box.errors in (1, 10, 100, 1000):  # not once a frame
                        log.warning("vision: %d frame(s) of session %s failed, the last: %s", box.errors, sid, msg[2])
        with self._lock:
            self.dead = True
            for box in self._sessions.values():
                box.in_flight = False
                _resolve(box.seen)
                _resolve(box.reading)
        if not self._stopping:
            log.warning("vision worker exited (code %s): sessions go on without seeing", self._proc.exitcode)


def _resolve(f: Future[None] | None) -> None:
    if f is not None and not f.done():
        f.set_result(None)


def _main(requests: Any, results: Any) -> None:
    """The worker process: landmarks on this thread, OCR on its own."""
    # Below the conversation: when the cores are short, the micro-turns' deadlines win and perception slows
    # (a session's next frame waits while one is in flight) instead of the server missing deadlines.
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICE)
    try:  # a broken install ends the worker once, with its reason, not every frame with the same error
        from models.vision.detect import SessionDetectors, TextReader, import_mediapipe

        import_mediapipe()
    except Exception as exc:
        results.put(("fatal", "", f"{type(exc).__name__}: {exc}"))
        return

    ocr_slot: queue.Queue[tuple[str, float, npt.NDArray[np.uint8]] | None] = queue.Queue(maxsize=1)

    def read_texts() -> None:
        reader = TextReader()
        while (job := ocr_slot.get()) is not None:
            sid, t, frame = job
            try:
                results.put(("text", sid, t, reader.read(frame)))
            except Exception as exc:  # one bad frame must not end the reader
                results.put(("error", sid, f"OCR: {type(exc).__name__}: {exc}"))

    ocr = threading.Thread(target=read_texts, name="vision-ocr", daemon=True)
    ocr.start()
    sessions: dict[str, SessionDetectors] = {}
    while True:
        msg = requests.get()
        if msg[0] == "stop":
            break
        if msg[0] == "close":
            det = sessions.pop(msg[1], None)
            if det is not None:
                det.close()
            continue
        _, sid, t, frame, read_text = msg
        try:
            det = sessions.get(sid) or sessions.setdefault(sid, SessionDetectors())
            results.put(("obs", sid, det.observe(frame, t)))
        except Exception as exc:
            results.put(("error", sid, f"{type(exc).__name__}: {exc}"))
            continue
        if read_text:
            with contextlib.suppress(queue.Empty):  # the newest frame replaces one still waiting for the reader
                ocr_slot.get_nowait()
            ocr_slot.put((sid, t, frame))
    with contextlib.suppress(queue.Empty):  # a frame still waiting for the reader is not read
        ocr_slot.get_nowait()
    ocr_slot.put(None)
    for det in sessions.values():
        det.close()
    ocr.join(timeout=2.0)  # a reading under way is sent
    # Everything put is flushed, then the process ends without the interpreter's teardown of mediapipe's
    # and onnxruntime's modules (~1 s of a server's or a test's shutdown, for nothing).
    results.close()
    results.join_thread()
    os._exit(0)
