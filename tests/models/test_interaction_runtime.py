"""NativeModel behind the InteractionModel contract: batch invariance, feedback, checkpoints, memory, events."""

from pathlib import Path

import numpy as np
import pytest
import torch

from models.base import BackgroundChunk, TickInput, TickOutput
from models.interaction import (
    InteractionTransformer,
    KVPool,
    NativeModel,
    NativeSession,
    PoolFullError,
    TickFeatures,
    save_checkpoint,
    slots_for_budget,
)
from models.interaction.checkpoint import build
from models.interaction.config import ACTIONS
from models.interaction.dmel import CONTEXT, DMelFrontend
from models.interaction.inputs import QUEUE_LIMIT
from models.interaction.model import HeadOutputs
from tests.models.test_interaction_core import one_thread, small_cfg, small_net  # noqa: F401 - fixture

CPU = torch.device("cpu")


def speaking_net(seed: int = 0, action: str = "speak") -> InteractionTransformer:
    """An untrained net is biased to silence; force an action so audio and feedback really flow."""
    net = small_net(seed=seed)
    bias = net.control_head.bias
    assert bias is not None
    with torch.no_grad():
        bias.zero_()
        bias[ACTIONS.index(action)] = 5.0
    return net


def ticks(seed: int, n: int) -> list[TickInput]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        audio = (rng.standard_normal(4800) * 0.1).astype(np.float32)
        video = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) if i % 4 == 1 else None
        text = ["hello there"] if i == 2 else []
        bg = [BackgroundChunk("r1", 0, "the answer is 42", done=True)] if i == 3 else []
        out.append(TickInput(audio, 4800, video=video, text=text, background=bg))
    return out


def same(a: TickOutput, b: TickOutput) -> bool:
    return (
        np.array_equal(a.audio, b.audio)
        and a.text == b.text
        and a.user_text == b.user_text
        and [(e.type, e.data) for e in a.events] == [(e.type, e.data) for e in b.events]
    )


def test_session_alone_equals_batched_with_two_others_of_different_ages() -> None:
    net = speaking_net()
    alone_m = NativeModel(net, "native:test", 1, CPU, deterministic=True)
    batch_m = NativeModel(net, "native:test", 3, CPU, deterministic=True)
    tx, ty, tz = ticks(0, 10), ticks(1, 14), ticks(2, 8)
    x_alone = alone_m.open("x")
    y = batch_m.open("y")
    for t in ty[:4]:  # y is four micro-turns older than x
        batch_m.step([(y, t)])
    x = batch_m.open("x")
    z = None
    for n in range(10):
        (ref,) = alone_m.step([(x_alone, tx[n])])
        if n == 2:
            z = batch_m.open("z")  # z joins two micro-turns after x
        batch = [(y, ty[n + 4]), (x, tx[n])] + ([(z, tz[n - 2])] if z is not None else [])
        got = batch_m.step(batch)[1]
        assert ref.audio.shape == (4800,) and ref.audio.dtype == np.float32
        assert np.any(ref.audio), "the forced-speaking model must produce sound (else the test is vacuous)"
        assert same(ref, got), f"micro-turn {n}: alone and batched differ"
    assert x.tick == 10 and y.tick == 14


def test_runtime_stream_equals_teacher_forced_sequence_including_feedback() -> None:
    """Record what the runtime fed the model (own audio and text fed back included), replay it whole."""
    net = speaking_net()
    model = NativeModel(net, "native:test", 1, CPU, deterministic=True)
    s = model.open("trace")
    trace: list[tuple[TickFeatures, HeadOutputs]] = []
    for t in ticks(3, 9):
        model.step([(s, t)], observe=lambda _, f, h: trace.append((f, h)))
    feats = TickFeatures.cat([f for f, _ in trace])
    assert feats.self_dmel[1:].any(), "the model's own audio must come back as input"
    with torch.inference_mode():
        whole = net.forward_sequence(feats)
    for n, (_, heads) in enumerate(trace):
        for k in ("control", "text", "transcript", "audio_cond"):
            assert torch.equal(getattr(heads, k)[0], getattr(whole, k)[n]), f"{k} differs at micro-turn {n}"


def test_same_session_id_replays_bit_for_bit_and_others_differ() -> None:
    model = NativeModel(speaking_net(), "native:test", 3, CPU, deterministic=True)
    a, b, c = model.open("same"), model.open("same"), model.open("other")
    for t in ticks(4, 3):
        oa, ob, oc = model.step([(a, t), (b, t), (c, t)])
        assert same(oa, ob)
    assert not np.array_equal(oa.audio, oc.audio), "flow noise is seeded per session"


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    net = speaking_net(seed=7)
    path = tmp_path / "w.safetensors"
    save_checkpoint(net, path, "test")
    loaded = build("test", str(path))
    m1 = NativeModel(net, "native:test", 1, CPU, deterministic=True)
    m2 = NativeModel(loaded, "native:test", 1, CPU, deterministic=True)
    s1, s2 = m1.open("s"), m2.open("s")
    for t in ticks(5, 4):
        assert same(m1.step([(s1, t)])[0], m2.step([(s2, t)])[0])
    with pytest.raises(ValueError, match="run with --model native:test"):
        build("tiny", str(path))
    with pytest.raises(FileNotFoundError, match="--checkpoint"):
        build("tiny", str(tmp_path / "missing.safetensors"))


def _tensor_bytes(s: NativeSession) -> int:
    return sum(v.numel() * v.element_size() for v in vars(s).values() if isinstance(v, torch.Tensor))


def test_memory_per_session_is_constant_after_the_window_fills() -> None:
    model = NativeModel(speaking_net(), "native:test", 2, CPU, deterministic=False)
    pool_before = [(x.data_ptr(), x.shape) for x in (*model.pool.k, *model.pool.v, model.pool.conv)]
    s = model.open("m")
    sizes = []
    for t in ticks(6, 16):  # windows: sliding 2, global 4 micro-turns
        model.step([(s, t)])
        sizes.append(_tensor_bytes(s))
    assert len(set(sizes)) == 1, sizes
    # Text buffers are bounded too (queues by QUEUE_LIMIT, the transcript tail by 500 characters).
    assert len(s.typed) <= QUEUE_LIMIT and len(s.background) <= QUEUE_LIMIT and len(s.transcript) <= 500
    assert [(x.data_ptr(), x.shape) for x in (*model.pool.k, *model.pool.v, model.pool.conv)] == pool_before
    assert model.session_bytes == KVPool.session_bytes(model.cfg, torch.float32)


def test_pool_limits_are_explained() -> None:
    model = NativeModel(small_net(), "native:test", 1, CPU, deterministic=False)
    s = model.open("a")
    with pytest.raises(PoolFullError, match="KV slots are in use"):
        model.open("b")
    model.close(s)
    model.open("b")  # the slot is reusable after close
    with pytest.raises(ValueError, match="cannot hold even one"):
        slots_for_budget(small_cfg(), torch.float32, 1000, "native:test")
    with pytest.raises(ValueError, match="was closed"):
        model.step([(s, ticks(0, 1)[0])])


def test_control_decisions_become_events() -> None:
    model = NativeModel(speaking_net(action="delegate"), "native:test", 1, CPU, deterministic=False)
    s = model.open("d")
    inputs = ticks(7, 4)
    inputs[0].text = ["what is the weather"]
    outs = [model.step([(s, t)])[0] for t in inputs]
    delegates = [e for o in outs for e in o.events if e.type == "delegate"]
    assert len(delegates) == 1, "delegate fires when the decision starts, not every micro-turn"
    assert delegates[0].data["query"] == "what is the weather"  # no transcript yet: the typed text
    assert all(not o.audio.any() for o in outs), "delegating is silent"

    model = NativeModel(speaking_net(action="backchannel"), "native:test", 1, CPU, deterministic=False)
    s = model.open("b")
    out = model.step([(s, ticks(8, 1)[0])])[0]
    assert [e.type for e in out.events] == ["backchannel"] and out.audio.any()


def test_cancel_silences_the_micro_turn() -> None:
    model = NativeModel(speaking_net(), "native:test", 1, CPU, deterministic=False)
    s = model.open("c")
    t0, t1 = ticks(9, 2)
    assert model.step([(s, t0)])[0].audio.any()
    t1.cancel = True
    out = model.step([(s, t1)])[0]
    assert not out.audio.any() and [e.type for e in out.events] == ["yielded"]


def test_dmel_levels() -> None:
    fe = DMelFrontend(80, 16, CPU)
    silence = torch.zeros(1, CONTEXT + 4800)
    assert fe(silence, det=False).max().item() == 0
    t = torch.arange(CONTEXT + 4800) / 24000
    tone = (0.5 * torch.sin(2 * torch.pi * 1000 * t))[None]
    levels = fe(tone, det=False)  # [1, 20, 80]
    assert levels.shape == (1, 20, 80) and levels.max().item() == 15
    # 1 kHz sits at mel 1000 of 0..2840 (8 kHz): about bin 27 of 80.
    peak = int(levels[0, 10].float().argmax())
    assert 24 <= peak <= 30, peak
