"""`--model moshi`: a session served in a batch of slots is exactly moshi's own `LMGen` run alone.

A tiny random Moshi (models/moshi/tiny.py, the package's own configs shrunk, written in the released
layout) is served by `MoshiModel`; moshi's `LMGen` and Mimi, built separately by moshi's own loaders
from the same files, replay each session alone at batch 1. Tokens must be equal frame for frame and
the audio equal, while other sessions join, leave, skip micro-turns (a detached session is not
stepped) and a slot is reused mid-run; sampled runs too, each session with its own seed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

# Not importorskip: models.moshi imports moshi itself, with torch.compile off on a CPU.
if importlib.util.find_spec("moshi") is None:
    pytest.skip("the optional moshi package is not installed: make setup-moshi", allow_module_level=True)

from models.base import TickInput
from models.moshi import checkpoint, tiny
from models.moshi.runtime import import_moshi
from models.moshi.sampling import Sampling
from models.moshi.serving import MoshiModel, MoshiSession
from streaming.types import TICK_SAMPLES

SAMPLED = Sampling(temp=0.8, temp_text=0.7, top_k=20, top_k_text=10)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)  # tiny ops: threads cost more than they give on the shared 2-core box
    return tiny.write(tmp_path_factory.mktemp("tiny-moshi"))


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> tuple[Any, Any]:
    """moshi's own LM and Mimi, loaded by moshi's loaders (not ours) from the same files."""
    loaders = import_moshi().models.loaders
    info = loaders.CheckpointInfo.from_hf_repo(
        "tiny", config_path=tiny_dir / tiny.CONFIG_NAME, moshi_weights=tiny_dir / tiny.LM_NAME,
        mimi_weights=tiny_dir / tiny.MIMI_NAME, tokenizer=tiny_dir / tiny.TOKENIZER_NAME,
        mimi_config_path=tiny_dir / tiny.MIMI_CONFIG_NAME)
    return info.get_moshi(device="cpu", dtype=torch.float32), info.get_mimi(device="cpu")


def served(tiny_dir: Path, sampling: Sampling, slots: int) -> MoshiModel:
    parts = checkpoint.load(str(tiny_dir), torch.device("cpu"), torch.float32)
    return MoshiModel(parts.lm, parts.mimi, parts.tokenizer, slots, sampling, conditions=parts.conditions(slots))


def alone(reference: tuple[Any, Any], ticks: list[np.ndarray], sampling: Sampling,
          seed: int, conditions: Any = None) -> tuple[list[list[int] | None], np.ndarray]:
    """moshi's LMGen at batch 1 over a session's input: tokens per frame and the audio stream
    (960 samples of lead, then each frame's decoded audio or silence while ungenerated)."""
    lm_model, mimi = reference
    moshi = import_moshi()
    gen = moshi.models.lm.LMGen(lm_model, use_sampling=not sampling.greedy, temp=sampling.temp,
                                temp_text=sampling.temp_text, top_k=sampling.top_k, top_k_text=sampling.top_k_text,
                                condition_tensors=conditions)
    audio = np.concatenate(ticks)
    frame = mimi.frame_size
    tokens: list[list[int] | None] = []
    pcm = [np.zeros((frame - TICK_SAMPLES % frame) % frame, np.float32)]
    torch.manual_seed(seed)  # moshi samples from the global generator
    with torch.no_grad(), gen.streaming(1), mimi.streaming(1):
        for i in range(len(audio) // frame):
            codes = mimi.encode(torch.from_numpy(audio[i * frame:(i + 1) * frame])[None, None])
            out = gen.step(codes)
            if out is None:
                tokens.append(None)
                pcm.append(np.zeros(frame, np.float32))
            else:
                tokens.append(out[0, :, 0].tolist())
                pcm.append(mimi.decode(out[:, 1:])[0, 0].numpy())
    return tokens, np.concatenate(pcm)


def noise(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(TICK_SAMPLES) * 0.1).astype(np.float32) for _ in range(n)]


# Who is stepped at each micro-turn (slots=3): c joins at 1, b is detached (not stepped) at 2, c leaves
# after 2 and d takes its slot at 3 (a reset mid-run); from then on a batch mixes sessions at different
# frame phases (3 frames for a, 2 for b and d at micro-turn 3).
SCHEDULE = [["a", "b"], ["a", "b", "c"], ["a", "c"], ["a", "b", "d"], ["a", "b", "d"]]


@dataclass
class Run:
    state: MoshiSession
    inputs: list[np.ndarray] = field(default_factory=list)
    tokens: list[list[int] | None] = field(default_factory=list)  # per Mimi frame, as the observer saw them
    audio: list[np.ndarray] = field(default_factory=list)  # per micro-turn
    text: str = ""


def run_schedule(model: MoshiModel) -> dict[str, Run]:
    inputs = {name: iter(noise(k, len(SCHEDULE))) for k, name in enumerate("abcd")}
    runs: dict[str, Run] = {}
    by_state: dict[int, Run] = {}
    for t, names in enumerate(SCHEDULE):
        if t == 3:
            model.close(runs["c"].state)
        for name in names:
            if name not in runs:
                runs[name] = Run(model.open(f"session-{name}"))
                by_state[id(runs[name].state)] = runs[name]
        batch = []
        for name in names:
            runs[name].inputs.append(next(inputs[name]))
            batch.append((runs[name].state, TickInput(runs[name].inputs[-1], TICK_SAMPLES)))
        outs = model.step(batch, observe=lambda st, tok: by_state[id(st)].tokens.append(tok))
        torch.rand(t + 1)  # draws from torch's global generator change nothing: sessions use their own
        for name, out in zip(names, outs, strict=True):
            assert out.audio.shape == (TICK_SAMPLES,) and out.audio.dtype == np.float32
            runs[name].audio.append(out.audio)
            runs[name].text += out.text
    return runs


@pytest.fixture(scope="module", params=["greedy", "sampled"])
def compared(request: pytest.FixtureRequest, tiny_dir: Path, reference: tuple[Any, Any]) -> Iterator[Any]:
    sampling = Sampling(greedy=True) if request.param == "greedy" else SAMPLED
    model = served(tiny_dir, sampling, slots=3)
    runs = run_schedule(model)
    yield model, sampling, runs, {name: alone(reference, r.inputs, sampling, r.state.seed) for name, r in runs.items()}


def test_every_session_equals_lmgen_alone(compared: Any) -> None:
    """Joining, leaving, skipping and a reused slot leave every session exactly what it is alone."""
    _, _, runs, refs = compared
    for name, run in runs.items():
        want_tokens, want_audio = refs[name]
        assert len(run.tokens) == len(want_tokens) == len(run.inputs) * TICK_SAMPLES // 1920, name
        assert run.tokens == want_tokens, f"session {name}: tokens differ from LMGen alone"
        got = np.concatenate(run.audio)
        n = min(len(got), len(want_audio))
        assert n >= len(got) - 960
        np.testing.assert_allclose(got[:n], want_audio[:n], atol=1e-5, err_msg=f"session {name}: audio")
        assert any(t is not None for t in run.tokens) and np.any(got), f"session {name}: no audio was made"


def test_sampling_draws_per_session(compared: Any) -> None:
    """Each session id has its own seed; sampled sessions draw their own streams (each equal to LMGen
    seeded alone, above), so they differ."""
    _, sampling, runs, _ = compared
    seeds = {r.state.seed for r in runs.values()}
    assert len(seeds) == len(runs), "each session id gives its own seed"
    if not sampling.greedy:
        made = [[t for t in r.tokens if t is not None] for r in runs.values()]
        assert all(made) and len({str(m[:3]) for m in made}) == len(made), "sampled sessions differ"


def test_text_tokens_become_the_transcript(compared: Any) -> None:
    model, _, runs, _ = compared
    for run in runs.values():
        pieces = [t[0] for t in run.tokens if t is not None and t[0] not in model.skip_text]
        assert run.text == "".join(model.tokenizer.id_to_piece(p).replace("\u2581", " ") for p in pieces)
    assert any(run.text for run in runs.values())


def test_slots_are_held_until_close_and_cancel_silences(tiny_dir: Path) -> None:
    model = served(tiny_dir, Sampling(greedy=True), slots=2)
    a, b = model.open("a"), model.open("b")
    audio = noise(3, 3)
    assert np.any(model.step([(a, TickInput(audio[0], TICK_SAMPLES))])[0].audio)
    assert np.any(model.step([(a, TickInput(audio[1], TICK_SAMPLES))])[0].audio)
    cancelled = model.step([(a, TickInput(audio[2], TICK_SAMPLES, cancel=True))])[0]
    assert not np.any(cancelled.audio), "a cancel drops what was made and not yet sent"
    assert {a.slot, b.slot} == {0, 1} and model.max_sessions == 2
    with pytest.raises(RuntimeError, match="all 2 moshi slots are held"):
        model.open("c")
    model.close(a)
    with pytest.raises(ValueError, match="was closed"):
        model.step([(a, TickInput(noise(0, 1)[0], TICK_SAMPLES))])
    assert model.open("c").slot == a.slot


def test_hibiki_conditioning_served_per_slot(tmp_path: Path) -> None:
    """A checkpoint conditioned as Hibiki is (model_type hibiki, a looked-up description summed into every
    step): each slot is told "very_good", as moshi's own inference does, and a session beside another
    equals LMGen alone with that condition."""
    ckpt = tiny.write(tmp_path / "tiny-hibiki", preset="tiny-hibiki")
    model = served(ckpt, Sampling(greedy=True), slots=2)
    a, b = model.open("a"), model.open("b")
    ticks = noise(5, 2)
    got: list[Any] = []
    for k, audio in enumerate(ticks):
        batch = [(a, TickInput(audio, TICK_SAMPLES)), (b, TickInput(noise(9 + k, 1)[0], TICK_SAMPLES))]
        model.step(batch, observe=lambda st, tok: got.append(tok) if st is a else None)
    ref = checkpoint.load(str(ckpt), torch.device("cpu"), torch.float32)
    assert ref.model_type == "hibiki" and ref.conditions(1) is not None
    want, _ = alone((ref.lm, ref.mimi), ticks, Sampling(greedy=True), 0, ref.conditions(1))
    assert got == want and any(t is not None for t in got)
