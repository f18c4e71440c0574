"""Taking the floor needs confidence (models/interaction/onset.py): the rule, its wiring through real
model steps, its metadata, and the calibration bench's sweep (bench/native/onset.py)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bench.native.onset import Run, choose, judge, summarise
from models.base import TickInput
from models.interaction import InteractionTransformer, NativeModel, save_checkpoint
from models.interaction.checkpoint import checkpoint_metadata, update_metadata
from models.interaction.config import ACTIONS
from models.interaction.layers import Lin
from models.interaction.onset import (
    DELEGATE_KEY,
    ONSET_KEY,
    choose_delegate,
    choose_onset,
    decide,
    onset_from_metadata,
)
from models.interaction.options import NativeOptions
from tests.models.test_interaction_core import one_thread, small_net  # noqa: F401 - fixture

SPEAK, SILENT, BACKCHANNEL, YIELD, DELEGATE = range(len(ACTIONS))
SILENCE = np.zeros(4800, dtype=np.float32)


def test_an_onset_needs_the_threshold_and_speech_goes_on_greedily() -> None:
    probs = torch.tensor([
        [0.45, 0.30, 0.15, 0.05, 0.05],  # speak is the argmax, below 0.6, not speaking: the next best
        [0.45, 0.05, 0.30, 0.10, 0.10],  # ... which need not be silent
        [0.45, 0.30, 0.15, 0.05, 0.05],  # the same row, already speaking: it goes on
        [0.70, 0.10, 0.10, 0.05, 0.05],  # above the threshold: an onset
        [0.10, 0.20, 0.10, 0.55, 0.05],  # not speak at all: untouched
    ])
    speaking = [False, False, True, False, True]
    assert decide(probs, speaking, 0.6).tolist() == [SILENT, BACKCHANNEL, SPEAK, SPEAK, YIELD]
    assert decide(probs, speaking, 0.0).tolist() == probs.argmax(-1).tolist(), "0 is greedy decoding"
    assert decide(probs, torch.tensor(speaking), 0.46).tolist() == [SILENT, BACKCHANNEL, SPEAK, SPEAK, YIELD]
    assert decide(probs, speaking, 0.45).tolist() == [SPEAK, SPEAK, SPEAK, SPEAK, YIELD], "p >= threshold speaks"


def test_the_threshold_comes_from_the_metadata_unless_given(tmp_path: Path) -> None:
    assert onset_from_metadata({})[0] == 0.0, "no calibration recorded: greedy"
    assert onset_from_metadata({ONSET_KEY: "0.65"})[0] == pytest.approx(0.65)
    with pytest.raises(ValueError, match=r"bench\.native\.onset --write"):
        onset_from_metadata({ONSET_KEY: "1.5"})
    with pytest.raises(ValueError, match="--native-onset"):
        NativeOptions(onset=1.0)
    assert choose_onset(None, {ONSET_KEY: "0.65"})[0] == pytest.approx(0.65), "recorded, not given: the metadata's"
    assert choose_onset(0.0, {ONSET_KEY: "0.65"}) == (0.0, "--native-onset"), "given beats recorded"
    with pytest.raises(ValueError, match="--native-onset"):
        choose_onset(1.5, {})  # train.evaluate --onset takes no NativeOptions: checked here
    assert NativeOptions.from_env().onset is None
    # update_metadata adds the entry and leaves every tensor as it was, bit for bit.
    path = tmp_path / "c.safetensors"
    save_checkpoint(small_net(), path, "tiny", dtype=torch.float16, extra={"command": "x"})
    before, mode = load_file(str(path)), path.stat().st_mode
    update_metadata(path, {ONSET_KEY: "0.60"})
    meta = checkpoint_metadata("tiny", str(path))
    assert meta[ONSET_KEY] == "0.60" and meta["command"] == "x" and meta["preset"] == "tiny"
    after = load_file(str(path))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not path.with_name(path.name + ".tmp").exists() and path.stat().st_mode == mode


def _set_probs(net: InteractionTransformer, p: list[float]) -> None:
    """The control head outputs exactly these action probabilities (and 'user silent'), whatever it hears."""
    head = net.control_head
    assert isinstance(head, Lin) and head.bias is not None
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([math.log(x) for x in p] + [-5.0]))


def test_served_steps_hold_an_unsure_onset_back_and_never_cut_speech() -> None:
    net = small_net(seed=5)
    model = NativeModel(net, "native:test", 3, torch.device("cpu"), deterministic=True, onset_threshold=0.6)
    greedy = NativeModel(net, "native:test", 3, torch.device("cpu"), deterministic=True)
    st, gst = model.open("a"), greedy.open("b")
    unsure = [0.5, 0.3, 0.1, 0.05, 0.05]
    _set_probs(net, unsure)
    for _ in range(3):
        model.step([(st, TickInput(SILENCE, 4800))])
        greedy.step([(gst, TickInput(SILENCE, 4800))])
        assert not st.speaking and st.last_action == SILENT, "p(speak) 0.5 < 0.6: it waits"
        assert gst.speaking, "greedy decoding takes the floor at p(speak) 0.5"
    _set_probs(net, [0.8, 0.1, 0.05, 0.03, 0.02])
    model.step([(st, TickInput(SILENCE, 4800))])
    assert st.speaking, "a confident onset"
    _set_probs(net, unsure)
    for _ in range(3):
        model.step([(st, TickInput(SILENCE, 4800))])
        assert st.speaking, "once speaking, p(speak) 0.5 (still the argmax) goes on"
    model.close(st)
    greedy.close(gst)


def test_a_hand_off_needs_its_own_threshold_not_the_argmax() -> None:
    """p(delegate) >= the threshold hands off from silence whatever scores higher; never while speaking;
    the threshold comes from --native-delegate, else the checkpoint's metadata, else 0 (the argmax)."""
    probs = torch.tensor([
        [0.60, 0.15, 0.00, 0.00, 0.25],  # a look-up's end as the tiny model scores it: speak wins the argmax
        [0.60, 0.15, 0.00, 0.00, 0.25],  # the same while speaking: it goes on
        [0.10, 0.80, 0.00, 0.00, 0.10],  # below the threshold: silent
        [0.45, 0.30, 0.00, 0.00, 0.25],  # an unsure onset held back, and a hand-off instead
    ])
    speaking = [False, True, False, False]
    assert decide(probs, speaking, 0.0, 0.2).tolist() == [DELEGATE, SPEAK, SILENT, DELEGATE]
    assert decide(probs, speaking, 0.6, 0.0).tolist() == [SPEAK, SPEAK, SILENT, SILENT], "0: the argmax"
    assert decide(probs, speaking, 0.6, 0.3).tolist() == [SPEAK, SPEAK, SILENT, SILENT]
    assert choose_delegate(None, {})[0] == 0.0 and choose_delegate(None, {DELEGATE_KEY: "0.2"})[0] == 0.2
    assert choose_delegate(0.0, {DELEGATE_KEY: "0.2"}) == (0.0, "--native-delegate"), "given beats recorded"
    with pytest.raises(ValueError, match="--native-delegate"):
        NativeOptions(delegate=1.0)
    with pytest.raises(ValueError, match=r"train\.evaluate"):
        choose_delegate(None, {DELEGATE_KEY: "2"})
    # Served: one "delegate" event with the typed request as its query, then no second one while it lasts.
    net = small_net(seed=6)
    model = NativeModel(net, "native:test", 2, torch.device("cpu"), deterministic=True, delegate_threshold=0.2)
    st = model.open("d")
    _set_probs(net, [0.6, 0.15, 0.0001, 0.0001, 0.2498])
    outs = model.step([(st, TickInput(SILENCE, 4800, text=["when does the pool close?"]))])
    outs += model.step([(st, TickInput(SILENCE, 4800))])
    assert [e.data for o in outs for e in o.events if e.type == "delegate"] == [{"query": "when does the pool close?"}]
    assert not st.speaking
    model.close(st)


def _run(kind: str, ref: float, spoke: str, seconds: float = 6.0) -> Run:
    return Run(f"{kind}/x", kind, seconds, ref, [c == "S" for c in spoke])


def test_the_sweep_judges_closed_loop_runs_as_fdbench_would_and_chooses_the_fastest_within_the_pause_bound() -> None:
    q = "." * 10  # 2 s of silence
    # A pause: speaking 2.2 s into a 6 s sample is a take-over; from 5.2 s it cannot last a second.
    assert judge(_run("pause", 0, q + "SSSS"))[0] and not judge(_run("pause", 0, "." * 25 + "SSSSS"))[0]
    # A question ending at 2.0 s answered from micro-turn 11: heard from 2.4 s.
    assert judge(_run("turn_taking", 2.0, q + ".SSSS")) == (True, pytest.approx(0.4))
    assert judge(_run("turn_taking", 2.0, "." * 30)) == (False, None)
    # An interruption ending at 2.0 s: what it said before does not count, nor a blip after it.
    assert judge(_run("interruption", 2.0, "SSSSS" + "." * 10 + "SS" + "." * 10)) == (False, None)
    assert judge(_run("interruption", 2.0, "SSSSS" + "." * 6 + "SSSSSS")) == (True, pytest.approx(0.4))
    eager = summarise(0.0, [_run("pause", 0, q + "SSSS"), _run("turn_taking", 2.0, q + "SSSS"),
                            _run("interruption", 2.0, q + ".SSSSS")])
    patient = summarise(0.6, [_run("pause", 0, "." * 30), _run("turn_taking", 2.0, q + ".SSSS"),
                              _run("interruption", 2.0, "." * 30)])
    assert (eager["pause"]["rate"], eager["turn_taking"]["rate"], eager["j"]) == (1.0, 1.0, 0.0)
    assert patient["j"] == 0.5 and patient["turn_taking"]["latency_mean"] == pytest.approx(0.4)
    assert eager["j"] < patient["j"], "J is reported beside each threshold"
    assert choose([eager, patient]) is patient, "the only one within the default bound (0.3) on pauses taken"
    assert choose([eager, patient], max_pause=1.0) is eager, "the lowest within the bound: the fastest"
    halfway = {**eager, "threshold": 0.55, "pause": {"n": 2, "rate": 0.5}}
    assert choose([eager, halfway], max_pause=0.2) is halfway, "none within the bound: the fewest taken"
