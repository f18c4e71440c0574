"""Streaming pocketsphinx in worker processes: the same words as in-process, and failures contained."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest

from models.base import TickInput, wait_work
from models.cascade import CascadeModel, load_cascade
from models.speech import sphinx_worker as wire
from models.speech.sphinx import ASR_RATE, SphinxRecognizer, shared_pool
from models.speech.sphinx_remote import RemoteSphinxRecognizer, SphinxProcesses
from models.speech.tts import synthesize
from streaming.resample import resample
from streaming.types import SAMPLE_RATE, TICK_SAMPLES

CHUNK = ASR_RATE // 5  # 200 ms


@pytest.fixture(scope="module")
def sentence() -> np.ndarray:
    audio, sr = synthesize("Can you remind me to call my sister on Friday afternoon?")
    return resample(audio, sr, ASR_RATE)


@pytest.fixture(scope="module")
def worker() -> Iterator[SphinxProcesses]:
    p = SphinxProcesses(1, decoders=1)
    yield p
    p.close()


@pytest.fixture()
def procs(worker: SphinxProcesses) -> SphinxProcesses:
    """The module's one worker child (a child's start is ~1 s of CPU), live and ready: a test that killed it
    left a replacement starting. Its counters (`respawned`, `shed`) add up over the module's tests."""
    worker.replace_dead()
    _wait_ready(worker)
    return worker


def _partials(rec: SphinxRecognizer | RemoteSphinxRecognizer, x: np.ndarray) -> list[str]:
    rec.start()
    out = []
    for i in range(0, len(x), CHUNK):
        rec.send(x[i : i + CHUNK])
        out.append(rec.collect(5.0))
    return out


def _wait_ready(procs: SphinxProcesses, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while procs.ready_count() < 1:
        assert time.monotonic() < deadline, "no ASR worker process became ready"
        time.sleep(0.05)


def test_worker_process_gives_the_same_partials_and_words_as_in_process(
    sentence: np.ndarray, procs: SphinxProcesses
) -> None:
    local, remote = SphinxRecognizer(shared_pool()), RemoteSphinxRecognizer(procs)
    t = time.process_time()
    heard = _partials(remote, sentence)
    spent = time.process_time() - t
    assert heard == _partials(local, sentence)
    a, b = remote.finish(), local.finish()
    assert a.text == b.text and "sister" in a.text and "friday" in a.text
    # Word times may differ by a 10 ms frame: the two sides' decoders were used by different earlier
    # tests (per-utterance state beyond the reset cepstral mean).
    assert all(abs(x[1] - y[1]) <= 0.011 and abs(x[2] - y[2]) <= 0.011 for x, y in zip(a.words, b.words, strict=True))
    # The decoding happened in the child: this process spent almost nothing on it.
    assert spent < 0.1, f"{spent:.3f} s of this process's CPU for a sentence decoded in the child"


def test_a_killed_worker_falls_back_to_the_last_partial_and_is_replaced(
    sentence: np.ndarray, procs: SphinxProcesses
) -> None:
    rec = RemoteSphinxRecognizer(procs)
    respawned = procs.respawned
    half = sentence[: len(sentence) // 2]
    before = _partials(rec, half)[-1]
    assert before  # some words so far
    os.kill(procs.pids[0], signal.SIGKILL)
    rec.send(sentence[len(half) : len(half) + CHUNK])
    assert rec.collect(5.0) == before  # no answer from a dead child: the last partial stands
    assert rec.finish().text == before
    procs.replace_dead()
    _wait_ready(procs)
    assert procs.respawned == respawned + 1
    assert "sister" in " ".join(_partials(rec, sentence))
    assert "friday" in rec.finish().text


def test_the_worker_answers_a_bad_request_with_an_error_and_keeps_serving(
    sentence: np.ndarray, procs: SphinxProcesses
) -> None:
    proc, _ = procs.lend()
    assert proc is not None
    fut = proc.request(wire.FEED, 999_999, 1, b"\0\0" * CHUNK, reply=True)
    assert fut is not None
    with pytest.raises(Exception, match="unknown utterance"):
        fut.result(5.0)
    procs.give_back(proc)
    rec = RemoteSphinxRecognizer(procs)
    assert "friday" in _partials(rec, sentence)[-1]
    rec.abort()


def test_closing_ends_the_worker_processes() -> None:
    p = SphinxProcesses(2, decoders=0)  # nothing decoded: no decoder built before READY
    pids = p.pids
    p.close()
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # already reaped by close(): not our child any more


@pytest.fixture(scope="module")
def models(default_cascade: CascadeModel) -> Iterator[tuple[CascadeModel, CascadeModel]]:
    """ASR in worker processes (the default, asr_processes=2: the suite's shared default cascade, one
    load fewer; a session decodes in one of them) and in this process; every other option the same but
    the in-process pool's size: one decoder for the one session (the default, enough for max_sessions,
    builds six in this process, ~5 s of CPU)."""
    assert default_cascade.opts.asr_processes > 0, "the default cascade must decode in worker processes"
    b = load_cascade("asr_processes=0,asr_decoders=1")
    yield default_cascade, b
    b.shutdown()


def test_the_cascade_decides_the_same_with_asr_in_a_worker_as_in_process(
    models: tuple[CascadeModel, CascadeModel],
) -> None:
    audio, sr = synthesize("What is the tallest mountain in Europe?")
    mic = np.concatenate([np.zeros(SAMPLE_RATE // 2, np.float32), resample(audio, sr, SAMPLE_RATE),
                          np.zeros(SAMPLE_RATE * 2, np.float32)])
    runs = []
    for m in models:
        s = m.open("agree")
        events = []
        for i in range(0, len(mic) - TICK_SAMPLES + 1, TICK_SAMPLES):
            wait_work(m, [s])
            out = m.step([(s, TickInput(mic[i : i + TICK_SAMPLES], TICK_SAMPLES))])[0]
            events += [(i // TICK_SAMPLES, e.type, sorted(e.data.items())) for e in out.events]
        m.close(s)
        runs.append(events)
    assert runs[0] == runs[1]
    kinds = {k for _, k, _ in runs[0]}
    assert {"user_partial", "speech_started", "speech_stopped"} <= kinds


def test_an_overloaded_worker_sheds_audio_instead_of_falling_behind_for_good(
    sentence: np.ndarray, procs: SphinxProcesses
) -> None:
    rec = RemoteSphinxRecognizer(procs)
    shed = procs.shed
    rec.start()
    rec.send(sentence[:CHUNK])
    first = rec.collect(5.0)
    os.kill(procs.pids[0], signal.SIGSTOP)  # the child stops answering, as if starved of CPU
    try:
        rec.send(sentence[CHUNK : 2 * CHUNK])
        assert rec.collect(0.2) == first  # late: the tick goes on with the last partial
        rec.send(sentence[2 * CHUNK : 3 * CHUNK])  # still unanswered: this chunk is not queued
        assert procs.shed == shed + 1
    finally:
        os.kill(procs.pids[0], signal.SIGCONT)
    deadline = time.monotonic() + 10
    while rec.behind:  # the child catches up with what it was sent
        assert time.monotonic() < deadline, "the worker never answered after SIGCONT"
        time.sleep(0.05)
    rec.send(sentence[3 * CHUNK : 4 * CHUNK])
    rec.collect(5.0)
    assert procs.shed == shed + 1 and not rec.behind  # decoded again, none shed
    rec.abort()


def test_a_hung_worker_is_killed_instead_of_blocking_the_tick_thread(sentence: np.ndarray) -> None:
    procs = SphinxProcesses(1, decoders=0, write_timeout=0.5)  # it decodes nothing: no decoder built
    try:
        pid = procs.pids[0]
        os.kill(pid, signal.SIGSTOP)  # alive but reading nothing: its input pipe fills up
        recs = [RemoteSphinxRecognizer(procs) for _ in range(4)]
        for r in recs:
            r.start()
        t = time.monotonic()
        for _ in range(8):  # pre-roll style sends (no reply, never shed): ~200 kB, over a pipe's 64 kB
            for r in recs:
                r.send(sentence[:CHUNK], reply=False)
        assert time.monotonic() - t < 3.0  # one write timed out; the others see a dead child at once
        assert all(r.finish().text == "" for r in recs)
        deadline = time.monotonic() + 5
        while procs.ready_count():  # the reader thread notices the killed child
            assert time.monotonic() < deadline
            time.sleep(0.05)
        procs.replace_dead()
        _wait_ready(procs)
        assert procs.pids[0] != pid and procs.respawned == 1
    finally:
        procs.close()
