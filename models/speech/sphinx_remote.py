"""Streaming pocketsphinx in worker processes, so decoding never holds the server's GIL.

`SphinxProcesses` starts `asr_processes` children (`models.speech.sphinx_worker`) and lends one to
each utterance (the least busy); `RemoteSphinxRecognizer` is a `Recognizer` whose `send` writes
audio to its child and whose `collect` waits (GIL released) for the partial. The cascade sends every
session's audio of a micro-turn first and collects afterwards, so the children decode while the tick
thread runs VAD and the policy, and the partial a tick uses is still the one after that tick's audio
(media and real-time pace agree).

Failure: a child that dies fails its utterances' pending requests; those recognisers fall back to
their last partial (and `finish` to it) until their next utterance, which goes to a live child. A
dead child is replaced when the next utterance starts, without waiting for it on the tick thread.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from models.speech import sphinx_worker as wire
from models.speech.sphinx import CONFIGS, ASRError, Transcript, Word, _to_pcm16
from streaming.types import Audio

log = logging.getLogger(__name__)
_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the `models` package
_READY_TIMEOUT_S = 60.0  # building a decoder takes ~1 s; a loaded machine may take many times that
# A child that has not read a request within this long is hung (stopped, deadlocked): it is killed
# and replaced rather than left to block the tick thread on a full pipe.
WRITE_TIMEOUT_S = 2.0


class SphinxProcess:
    """One worker child and the thread that reads its replies."""

    def __init__(self, decoders: int, config: str = "streaming", write_timeout: float = WRITE_TIMEOUT_S) -> None:
        self._write_timeout = write_timeout
        env = dict(os.environ)
        # The child imports `models` the way this process did, installed or from a checkout.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "models.speech.sphinx_worker", "--decoders", str(decoders), "--config", config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        assert self._proc.stdin is not None
        self._in = self._proc.stdin.fileno()
        os.set_blocking(self._in, False)  # writes wait in `_write`, with a deadline
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, int], Future[bytes]] = {}
        self.ready: Future[bytes] = Future()
        self._pending[(0, 0)] = self.ready
        self.alive = True
        self._closing = False  # close() was called: the end of output is expected, not a failure
        self.active = 0  # utterances lent to this child and not yet ended
        self._reader = threading.Thread(target=self._read, name="sphinx-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def is_ready(self) -> bool:
        return self.alive and self.ready.done() and self.ready.exception() is None

    def request(
        self, op: int, utt: int, seq: int = 0, payload: bytes = b"", reply: bool = False
    ) -> Future[bytes] | None:
        """Write one request; a future for its reply when `reply`. ASRError if the child is gone."""
        fut: Future[bytes] | None = Future() if reply else None
        with self._lock:
            if not self.alive:
                raise ASRError(f"ASR worker process {self.pid} has exited")
            if fut is not None:
                self._pending[(utt, seq)] = fut
            try:
                self._write(wire.HEADER.pack(op, utt, seq, len(payload)) + payload)
            except (OSError, ValueError) as e:
                self._pending.pop((utt, seq), None)
                raise ASRError(f"ASR worker process {self.pid} is not accepting requests: {e}") from e
        return fut

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + self._write_timeout
        while view:
            try:
                view = view[os.write(self._in, view) :]
                continue
            except BlockingIOError:
                pass  # the pipe is full: the child is behind
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self._in], [], left)[1]:
                self._proc.kill()  # hung: its reader thread sees the end and fails its requests
                raise TimeoutError(f"it read nothing for {self._write_timeout:.1f} s and was killed")

    def _read(self) -> None:
        out = self._proc.stdout
        assert out is not None
        reason = "closed its output"
        try:
            while True:
                head = wire.read_exact(out, wire.HEADER.size)
                if head is None:
                    break
                op, utt, seq, n = wire.HEADER.unpack(head)
                payload = wire.read_exact(out, n) if n else b""
                if payload is None:
                    break
                with self._lock:
                    fut = self._pending.pop((utt, seq), None)
                if fut is None:
                    continue  # nobody waits any more (a late reply after a timeout)
                if op == wire.ERROR:
                    fut.set_exception(ASRError(payload.decode(errors="replace")))
                else:
                    fut.set_result(payload)
        except Exception as e:  # a torn frame: the child is unusable either way
            reason = f"sent a bad frame ({type(e).__name__}: {e})"
        try:
            code: int | None = self._proc.wait(1.0)
        except subprocess.TimeoutExpired:
            code = None
        with self._lock:
            self.alive = False
            pending, self._pending = self._pending, {}
        if not self._closing:
            log.warning("ASR worker process %d %s (exit code %s); its utterances fall back to their last "
                        "partial and new ones go to another worker", self.pid, reason, code)
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ASRError(f"ASR worker process {self.pid} {reason}"))

    def close(self, timeout: float = 2.0) -> None:
        with self._lock:
            self.alive, self._closing = False, True
            try:
                if self._proc.stdin is not None:
                    self._proc.stdin.close()  # the child exits at the end of its input
            except OSError:
                pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout)
        self._reader.join(timeout)


class SphinxProcesses:
    """`count` ASR worker children shared by every session of a model."""

    def __init__(
        self, count: int, decoders: int = 2, config: str = "streaming", write_timeout: float = WRITE_TIMEOUT_S
    ) -> None:
        if count < 1:
            raise ValueError(f"asr_processes must be >= 1 here (0 means decode in-process), got {count}")
        if config not in CONFIGS:
            raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {config!r}")
        self._decoders, self._config, self._write_timeout = decoders, config, write_timeout
        self.shed = 0  # chunks not decoded because their utterance's child was still behind
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.respawned = 0
        self._procs = [SphinxProcess(decoders, config, write_timeout) for _ in range(count)]
        for p in self._procs:  # start in parallel, then wait: a missing pocketsphinx fails at load
            try:
                p.ready.result(_READY_TIMEOUT_S)
            except (ASRError, FutureTimeout) as e:
                self.close()
                raise ASRError(
                    f"the ASR worker process did not start ({e or 'no answer in 60 s'}); check that "
                    "`python -m models.speech.sphinx_worker` runs, or set asr_processes=0"
                ) from e

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def ready_count(self) -> int:
        with self._lock:
            return sum(p.is_ready() for p in self._procs)

    def replace_dead(self) -> None:
        """Start a new child for each dead one (not waited for: it is ready in about a second)."""
        with self._lock:
            self._replace_dead()

    def _replace_dead(self) -> None:
        for i, p in enumerate(self._procs):
            if not p.alive:
                p.close(0.1)
                self._procs[i] = SphinxProcess(self._decoders, self._config, self._write_timeout)
                self.respawned += 1

    def lend(self) -> tuple[SphinxProcess | None, int]:
        """(the least busy ready child or None, a fresh utterance id). Dead children are replaced."""
        with self._lock:
            self._replace_dead()
            ready = [p for p in self._procs if p.is_ready()]
            best = min(ready, key=lambda p: p.active) if ready else None
            if best is not None:
                best.active += 1
            return best, next(self._ids)

    def give_back(self, proc: SphinxProcess) -> None:
        with self._lock:
            proc.active = max(0, proc.active - 1)

    def close(self) -> None:
        for p in self._procs:
            p.close()


class RemoteSphinxRecognizer:
    """A `Recognizer` whose decoding happens in an ASR worker process."""

    def __init__(self, procs: SphinxProcesses) -> None:
        self._procs = procs
        self._proc: SphinxProcess | None = None
        self._utt = 0
        self._seq = 0
        self._pending: Future[bytes] | None = None  # the reply `collect` waits for
        self._last: Future[bytes] | None = None  # the newest reply asked for, until it arrives
        self.active = False
        self.partial = ""

    @property
    def behind(self) -> bool:
        """The child has not answered the newest audio sent to it yet."""
        return self._last is not None and not self._last.done()

    def start(self) -> None:
        if self.active:
            raise ASRError("start() called twice; finish() or abort() the current utterance first")
        self._proc, self._utt = self._procs.lend()
        self._seq, self._pending, self._last, self.partial, self.active = 0, None, None, "", True
        if self._proc is None:
            log.warning("no ASR worker process is ready; this utterance has no streaming partials")
            return
        self._call(wire.START)

    def feed(self, audio: Audio) -> str:
        self.send(audio)
        return self.collect()

    def send(self, audio: Audio, reply: bool = True) -> None:
        if not self.active:
            raise ASRError("feed() before start(); start an utterance first")
        if not len(audio) or self._proc is None:
            return
        if reply and self.behind:
            # The child has not answered the last micro-turn's audio yet (it ran past `collect`'s
            # wait): it is overloaded. Queuing more would make it fall further behind for good, so
            # this chunk is not decoded; the partial misses its words, the final transcript
            # (Whisper, or the last partial) does not depend on it. Never happens while it keeps up.
            self._procs.shed += 1
            return
        fut = self._call(wire.FEED if reply else wire.FEED_QUIET, _to_pcm16(audio), reply)
        if reply:
            self._pending = self._last = fut

    def collect(self, timeout: float = 1.0) -> str:
        """The partial after everything sent so far; the previous one if the child is late (the late
        one is collected next time) or gone."""
        fut = self._pending
        if fut is None:
            return self.partial
        try:
            self.partial = fut.result(timeout).decode()
        except FutureTimeout:
            return self.partial
        except ASRError as e:
            self._lost(e)
        self._pending = None
        return self.partial

    def waiting(self) -> list[Future[bytes]]:
        """The partial `collect` will wait for, while it is not back."""
        return [self._pending] if self._pending is not None and not self._pending.done() else []

    def finish(self, timeout: float = 2.0) -> Transcript:
        if not self.active:
            return Transcript("")
        fallback = Transcript(self.partial)
        fut = self._call(wire.FINISH, reply=True) if self._proc is not None else None
        self._end()
        if fut is None:
            return fallback
        try:
            words: list[Word] = [(str(w), float(a), float(b)) for w, a, b in json.loads(fut.result(timeout))]
        except (FutureTimeout, ASRError, ValueError) as e:
            log.warning("no final pocketsphinx transcript (%s); using the last partial", e or "timeout")
            return fallback
        return Transcript(" ".join(w for w, _, _ in words), words)

    def abort(self) -> None:
        if self.active:
            if self._proc is not None:
                self._call(wire.ABORT)
            self._end()

    def _call(self, op: int, payload: bytes = b"", reply: bool = False) -> Future[bytes] | None:
        assert self._proc is not None
        self._seq += 1
        try:
            return self._proc.request(op, self._utt, self._seq, payload, reply)
        except ASRError as e:
            self._lost(e)
            return None

    def _lost(self, e: Exception) -> None:
        """The child went away mid-utterance: keep the last partial until the next utterance."""
        if self._proc is not None:
            log.warning("streaming ASR lost for this utterance: %s", e)
            self._procs.give_back(self._proc)
            self._proc = None

    def _end(self) -> None:
        if self._proc is not None:
            self._procs.give_back(self._proc)
        self._proc, self._pending, self._last, self.active, self.partial = None, None, None, False, ""
