"""T4: a native session rebuilt by replaying its micro-turn log is bit-identical to the one that lived.

A small native net in batch-invariant mode: a session lives N micro-turns (alongside another session,
as on a server); its log goes through bytes (as it would through the store) and is replayed into a
fresh session of the same id in another model instance; the KV-pool row, the conv state and every
per-session tensor match exactly, and so does the next micro-turn's output.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from models.base import TickInput, TickOutput
from models.interaction import NativeModel, NativeSession
from models.interaction.replay import ReplayDiverged, TickLog, decode_input, encode_input, replay
from tests.models.test_interaction_core import one_thread  # noqa: F401 - fixture
from tests.models.test_interaction_runtime import same, speaking_net, ticks

CPU = torch.device("cpu")
N = 12


def _pcm_exact(t: TickInput) -> TickInput:
    """The same input with audio on the PCM16 grid, as a 24 kHz client's always is."""
    audio = np.round(t.audio * 32768).clip(-32768, 32767).astype(np.float32) / np.float32(32768)
    return TickInput(audio, t.received, video=t.video, text=t.text, background=t.background, cancel=t.cancel)


def _row(model: NativeModel, s: NativeSession) -> list[torch.Tensor]:
    """Everything of the session's held in the pool, and its own tensors."""
    pool = model.pool
    return ([k[s.slot] for k in pool.k] + [v[s.slot] for v in pool.v] + [pool.conv[s.slot]]
            + [s.user_tail, s.self_tail, s.self_dmel, s.voc_mag, s.voc_phase])


@pytest.mark.usefixtures("one_thread")
def test_replayed_session_is_bit_identical() -> None:
    net = speaking_net()
    live_m = NativeModel(net, "native:test", 3, CPU, deterministic=True)
    inputs = ticks(7, N + 1)
    inputs = [_pcm_exact(t) if i % 2 else t for i, t in enumerate(inputs)]  # both audio encodings
    inputs[5].cancel = True
    live, other = live_m.open("sess_a"), live_m.open("sess_b")
    live.log = TickLog()
    for i, t in enumerate(inputs[:N]):
        live_m.step([(live, t), (other, ticks(9, N)[i])])  # batched with another session, as served
    data = live.log.to_bytes()
    assert len(live.log) == N and data
    # Another replica: a fresh model instance (other slots in use), the log read back from bytes.
    new_m = NativeModel(net, "native:test", 3, CPU, deterministic=True)
    new_m.open("someone_else")
    rebuilt = new_m.open("sess_a")
    rebuilt.log = TickLog()
    replay(new_m, rebuilt, TickLog.from_bytes(data))
    assert rebuilt.tick == live.tick == N
    for a, b in zip(_row(live_m, live), _row(new_m, rebuilt), strict=True):
        assert torch.equal(a, b)
    assert rebuilt.own_text == live.own_text and rebuilt.last_action == live.last_action
    assert rebuilt.log.to_bytes() == data  # the rebuilt session can move again
    nxt = inputs[N]
    assert same(live_m.step([(live, nxt)])[0], new_m.step([(rebuilt, nxt)])[0])


@pytest.mark.usefixtures("one_thread")
def test_a_replay_that_goes_another_way_is_refused() -> None:
    """Another net (a different checkpoint) cannot rebuild the session: the first output differs."""
    model = NativeModel(speaking_net(), "native:test", 1, CPU, deterministic=True)
    s = model.open("sess_a")
    s.log = TickLog()
    for t in ticks(3, 4):
        model.step([(s, t)])
    other = NativeModel(speaking_net(seed=1), "native:test", 1, CPU, deterministic=True)
    with pytest.raises(ReplayDiverged, match="micro-turn 0 of 4"):
        replay(other, other.open("sess_a"), TickLog.from_bytes(s.log.to_bytes()))


def test_inputs_round_trip_exactly_and_compactly() -> None:
    for t in ticks(5, 4) + [_pcm_exact(x) for x in ticks(6, 2)]:
        back = decode_input(encode_input(t))
        assert np.array_equal(back.audio, t.audio) and back.audio.dtype == np.float32
        assert back.text == t.text and back.background == t.background and back.cancel == t.cancel
        assert (back.video is None) == (t.video is None)
        if t.video is not None:
            assert back.video is not None and np.array_equal(back.video, t.video)
    silence = TickInput(np.zeros(4800, np.float32), 4800)
    assert len(encode_input(silence)) < 200  # a silent micro-turn costs next to nothing
    log = TickLog(max_ticks=2)
    for t in ticks(1, 3):
        log.add(t, TickOutput(np.zeros(4800, np.float32)))
    assert log.full and len(log) == 2  # past its bound a log stops: it can no longer rebuild the session
    model = NativeModel(speaking_net(), "native:test", 1, CPU, deterministic=True)
    with pytest.raises(ValueError, match="stopped at 2 micro-turns"):
        replay(model, model.open("sess_a"), log)


def test_a_corrupt_log_record_is_a_value_error_naming_it() -> None:
    # Store data is untrusted: the server turns a ValueError into "model state lost" for that session only.
    good = encode_input(TickInput(np.zeros(4800, np.float32), 0))
    for bad in (b"not zlib", good[: len(good) // 2], zlib.compress(b"\x00\x00\x00\x05{bad}")):
        with pytest.raises(ValueError, match="micro-turn log is corrupt"):
            decode_input(bad)
