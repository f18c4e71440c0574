"""A native session's micro-turn log, and rebuilding the session's state by replaying it.

The native model is deterministic per session: decisions are greedy, the flow noise is seeded by the
session id and the micro-turn (flow.tick_noise), and in batch-invariant mode a row's result does not
depend on who shares its batch. So everything a session holds (its KV-pool row and conv state, the
feedback tails, the text queues, the floor state) is a function of the inputs it was given. The log
keeps each micro-turn's input compactly, with a digest of the output it produced; `replay` steps a
freshly opened session with the same id through the inputs, and checks every output against its digest,
so a replay that went another way (another checkpoint, fast mode) is an error instead of a silent
divergence. Replay runs the model alone, micro-turn by micro-turn: it costs what serving the session
cost, at the speed of one session stepped back to back (bench/native/replay.py measures it).

Audio is kept as PCM16 when that is exact (a 24 kHz client's audio always is: it arrived as PCM16),
float32 otherwise; each record is zlib-compressed (silence costs almost nothing).
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import wait
from typing import Any, Protocol

import numpy as np

from models.base import BackgroundChunk, TickInput, TickOutput
from streaming.types import TICK_SAMPLES

MAX_LOG_TICKS = 3000  # 10 minutes: a longer session stops logging (it can no longer be rebuilt elsewhere)
_HEAD = struct.Struct("<I")  # length of a record's JSON header


class Stepping(Protocol):
    """What a replay steps (the native model, serving.py; not imported here: it imports this module)."""

    def step(self, batch: Sequence[tuple[Any, TickInput]]) -> list[TickOutput]: ...


class ReplayDiverged(ValueError):
    """A replayed micro-turn produced another output than the logged one."""


class TickLog:
    """One session's micro-turns: compact inputs and 8-byte output digests, in order."""

    def __init__(self, max_ticks: int = MAX_LOG_TICKS, base: int = 0) -> None:
        self.max_ticks = max_ticks
        self.base = base  # micro-turn of records[0]: those before were taken (written to the store)
        self.records: list[bytes] = []  # encode_input(tick input), one per micro-turn
        self.digests: list[bytes] = []  # output_digest(its output)
        self.full = False  # past max_ticks: logging stopped, the log no longer rebuilds the session
        self._told_full = False  # take() has handed out the end marker
        # add() runs on the inference thread, take() on the server's event loop: one at a time.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.records)

    @property
    def nbytes(self) -> int:
        return sum(len(r) for r in self.records) + 8 * len(self.digests)

    def add(self, tick: TickInput, out: TickOutput) -> None:
        if self.full:
            return
        record, digest = encode_input(tick), output_digest(out)
        with self._lock:
            if self.full or self.base + len(self.records) >= self.max_ticks:
                self.full = True
                return
            self.records.append(record)
            self.digests.append(digest)

    def framed(self) -> list[bytes]:
        """Each held micro-turn as one self-contained blob (length-prefixed record, then its digest)."""
        return [_HEAD.pack(len(r)) + r + d for r, d in zip(self.records, self.digests, strict=True)]

    def take(self) -> list[bytes]:
        """The micro-turns logged since the last take, framed; they leave memory (the store has them).
        Once the log is full, the last take ends with an end marker: a replay stops there, refused."""
        with self._lock:
            out = self.framed()
            self.base += len(self.records)
            self.records, self.digests = [], []
            if self.full and not self._told_full:
                self._told_full = True
                out.append(_HEAD.pack(0) + bytes(8))  # an empty record: "the log stopped here"
        return out

    def to_bytes(self) -> bytes:
        """The whole held log as one blob."""
        return b"".join(self.framed())

    @classmethod
    def from_bytes(cls, data: bytes, base: int = 0) -> TickLog:
        log, at = cls(base=base), 0
        while at < len(data):
            (n,) = _HEAD.unpack_from(data, at)
            at += _HEAD.size
            if at + n + 8 > len(data):
                raise ValueError("the micro-turn log is truncated")
            if n == 0:  # the end marker: logging stopped at this micro-turn
                log.full = True
                break
            log.records.append(data[at : at + n])
            log.digests.append(data[at + n : at + n + 8])
            at += n + 8
        return log


def encode_input(tick: TickInput) -> bytes:
    audio = tick.audio
    pcm = np.clip(np.round(audio * 32768.0), -32768, 32767).astype("<i2")
    exact = np.array_equal(pcm.astype(np.float32) / np.float32(32768.0), audio)
    body = pcm.tobytes() if exact else audio.astype("<f4").tobytes()
    video = b"" if tick.video is None else np.ascontiguousarray(tick.video, np.uint8).tobytes()
    head = {"n": tick.received, "pcm": exact, "t": tick.text, "c": tick.cancel,
            "b": [[c.request_id, c.epoch, c.text, c.done, c.error] for c in tick.background],
            "v": None if tick.video is None else list(tick.video.shape)}
    h = json.dumps(head, separators=(",", ":")).encode()
    return zlib.compress(_HEAD.pack(len(h)) + h + body + video, 6)


def decode_input(record: bytes) -> TickInput:
    """A logged micro-turn's input. Store data is untrusted: anything malformed is a ValueError naming it,
    which the server reports as the session's model state lost (server/claims.py), not a crash."""
    try:
        return _decode_input(record)
    except (zlib.error, struct.error, json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"a record of the micro-turn log is corrupt ({type(exc).__name__}: {exc})") from None


def _decode_input(record: bytes) -> TickInput:
    data = zlib.decompress(record)
    (n,) = _HEAD.unpack_from(data)
    head = json.loads(data[_HEAD.size : _HEAD.size + n])
    at = _HEAD.size + n
    if head["pcm"]:
        audio = np.frombuffer(data, "<i2", TICK_SAMPLES, at).astype(np.float32) / np.float32(32768.0)
        at += 2 * TICK_SAMPLES
    else:
        audio = np.frombuffer(data, "<f4", TICK_SAMPLES, at).astype(np.float32)
        at += 4 * TICK_SAMPLES
    video = None
    if head["v"] is not None:
        shape = tuple(int(x) for x in head["v"])
        video = np.frombuffer(data, np.uint8, int(np.prod(shape)), at).reshape(shape).copy()
    background = [BackgroundChunk(str(r), int(e), str(t), bool(d), err) for r, e, t, d, err in head["b"]]
    return TickInput(audio, int(head["n"]), video=video, text=[str(t) for t in head["t"]], background=background,
                     cancel=bool(head["c"]))


def output_digest(out: TickOutput) -> bytes:
    h = hashlib.blake2b(digest_size=8)
    h.update(np.ascontiguousarray(out.audio, "<f4").tobytes())
    h.update(json.dumps([out.text, out.user_text, [(e.type, e.data) for e in out.events]], default=str).encode())
    return h.digest()


def replay(model: Stepping, state: Any, log: TickLog,
           progress: Callable[[int, int], None] | None = None) -> None:
    """Step `state` (opened with the logged session's id, `log.base` micro-turns old: 0 for a fresh one)
    through every logged micro-turn; raises ReplayDiverged at the first output that differs from the
    log's, ValueError for a log that stopped (too long). `progress(done, total)` every 50."""
    if state.tick != log.base:
        raise ValueError(f"the log continues micro-turn {log.base}, the session is at {state.tick}; replay "
                         "rebuilds a session opened with the same id, from its first micro-turn on")
    if log.full:
        raise ValueError(f"the log stopped at {log.base + len(log)} micro-turns (its bound is {log.max_ticks}): "
                         "it cannot rebuild this session")
    # Work started off the thread that a step uses at a fixed later micro-turn (the talker's phrases, a
    # hand-off's transcription) is waited for, as the engine does in media pace: replayed back to back,
    # steps come faster than it.
    pending = getattr(model, "pending_work", None)
    for i, (record, digest) in enumerate(zip(log.records, log.digests, strict=True), log.base):
        if pending is not None:
            wait(pending(state))
        out = model.step([(state, decode_input(record))])[0]
        if output_digest(out) != digest:
            raise ReplayDiverged(f"micro-turn {i} of {log.base + len(log)} came out differently when replayed (another "
                                 "checkpoint, or not in batch-invariant mode); the session cannot be rebuilt")
        if progress is not None and (i + 1) % 50 == 0:
            progress(i + 1, log.base + len(log))
