"""models/interaction/overlap_check.py: a stop under a backchannel held, and the stop an interruption wanted."""

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.fdbench import generate as fdbench
from models.interaction import NativeModel
from models.interaction.overlap_check import (
    BYSTANDER_TICKS,
    FREE,
    GRACE_TICKS,
    HOLD,
    LONGEST_TICKS,
    STOP,
    STOP_P,
    SURE_DB,
    Overlap,
    OverlapChecker,
    ruling,
)
from models.speech.asr import ASR_RATE
from models.turns.level import speech_db
from streaming.resample import resample
from streaming.types import TICK_SECONDS
from streaming.wav import read_wav
from tests.models._native_shipped import shipped_model, without
from tests.models.native_steps import step_through
from train.episodes import Speaker

RATE = 24_000


def test_the_cues_hold_a_stop_while_they_say_backchannel_and_give_back_the_stop_they_held() -> None:
    assert ruling(Overlap(opened=10, p_interrupt=0.1), 11) == HOLD, "the probe, before any words"
    assert ruling(Overlap(opened=10, p_interrupt=0.7), 11) == FREE, "the probe hears an interruption"
    assert ruling(Overlap(opened=10, p_interrupt=STOP_P), 10) == STOP, "... and is sure of it: a stop at once"
    quiet_sure = Overlap(opened=10, p_interrupt=STOP_P, user_db=-20.0)
    quiet_sure.hear(_tone(-32.0))
    assert ruling(quiet_sure, 10) == FREE, "... not for a bystander"
    assert ruling(Overlap(opened=10, p_interrupt=None), 11) == FREE, "no cue: the model decides"
    sure_but_said = Overlap(opened=10, p_interrupt=STOP_P, words="Mm-hmm, I see.")
    assert ruling(sure_but_said, 12) == HOLD, "words overrule the probe"
    assert ruling(Overlap(opened=10, p_interrupt=0.1, words="Hang on."), 12) == FREE, "... both ways"
    # A held stop comes back once the words say something else, or the user is still at it when the hold ends.
    assert ruling(Overlap(opened=10, p_interrupt=0.1, words="Okay, stop.", held_stop=True), 13) == STOP
    assert ruling(Overlap(opened=10, p_interrupt=0.1, held_stop=True), 10 + LONGEST_TICKS) == STOP
    # Only backchannel words may run twice as long: "Mm-hmm, I see." is 1.1-1.4 s.
    assert ruling(Overlap(opened=10, p_interrupt=0.1, words="Mm-hmm, I see."), 10 + LONGEST_TICKS) == HOLD
    assert ruling(Overlap(opened=10, p_interrupt=0.1, words="Mm-hmm, I see."), 10 + 2 * LONGEST_TICKS) == FREE
    # After the user falls silent the hold lasts a little (the model's urge to stop peaks a micro-turn late),
    # then the model decides again; a backchannel that ended is no stop to give back.
    quiet = Overlap(opened=10, p_interrupt=0.1, words="Okay.", ended=12, held_stop=True)
    assert ruling(quiet, 12 + GRACE_TICKS) == HOLD
    assert ruling(quiet, 13 + GRACE_TICKS) == FREE
    said = Overlap(opened=10, p_interrupt=0.1, words="Stop.", ended=12, held_stop=True)
    assert ruling(said, 13) == STOP, "a short interruption said and waiting: the stop it wanted"
    # A bystander's talk (a television 5 dB or more under the user's own voice) holds a stop as long as it
    # lasts, whatever its words, and gives none back when it ends: the model decides again.
    tv = Overlap(opened=10, p_interrupt=0.7, user_db=-20.0, words="Tomorrow will be sunny.", held_stop=True)
    for _ in range(BYSTANDER_TICKS - 1):
        tv.hear(_tone(-32.0))
    assert tv.bystander and ruling(tv, 11) == FREE, "too little speech yet to tell (a user's soft restart)"
    tv.hear(_tone(-32.0))
    assert ruling(tv, 10 + 4 * LONGEST_TICKS) == HOLD
    tv.ended = 40
    assert ruling(tv, 40 + GRACE_TICKS) == HOLD
    assert ruling(tv, 41 + GRACE_TICKS) == FREE


def _tone(db: float, seconds: float = TICK_SECONDS) -> np.ndarray:
    """A 220 Hz tone at `db` dBFS (its mean power), 24 kHz."""
    t = np.arange(int(seconds * RATE)) / RATE
    return (np.sqrt(2 * 10 ** (db / 10)) * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_the_sure_stop_waits_where_the_level_is_between_the_users_and_a_bystanders() -> None:
    """A television's first words read louder than the rest (`SURE_DB`): a sure probe stops the model at once
    only where the overlap sounds at the user's level, else once its level is read and is not a bystander's."""
    at_once = Overlap(opened=10, p_interrupt=STOP_P, user_db=-20.0)
    at_once.hear(_tone(-20.0 - SURE_DB + 0.5))
    assert ruling(at_once, 10) == STOP, "at the user's level: a stop at once"
    soft, tv = (Overlap(opened=10, p_interrupt=STOP_P, user_db=-20.0) for _ in range(2))
    for tick, (s_db, tv_db) in enumerate([(-23.5, -23.5), (-23.5, -33.0), (-23.5, -33.0)], 10):
        soft.hear(_tone(s_db))
        tv.hear(_tone(tv_db))
        if tick < 10 + BYSTANDER_TICKS - 1:
            assert ruling(soft, tick) == FREE and ruling(tv, tick) == FREE, f"not yet told apart at {tick}"
    assert ruling(soft, 12) == STOP, "a soft interruption, read from three micro-turns: the sure stop"
    assert tv.bystander and ruling(tv, 12) == HOLD, "a television: a stop held, none brought"


def test_whose_voice_an_overlap_is_is_read_again_as_it_goes_on() -> None:
    """An utterance's first words are its loudest: a television line can open at the user's level and fall
    well under it. Its level so far is re-read every micro-turn (`Overlap.hear`)."""
    ov = Overlap(opened=10, p_interrupt=0.7, user_db=-20.0)
    ov.hear(_tone(-22.0))
    assert not ov.bystander, "2 dB under the user: theirs"
    for _ in range(4):
        ov.hear(_tone(-36.0))
    assert ov.level.db is not None and ov.level.db < -25.0 and ov.bystander
    assert not Overlap(opened=10, p_interrupt=0.7).bystander, "no level of the user's yet: no gate"
    unknown = Overlap(opened=10, p_interrupt=0.7)
    unknown.hear(_tone(-40.0))
    assert not unknown.bystander


def _say(text: str, voice: str) -> np.ndarray:
    os.environ.setdefault("DUPLEX_TTS_DETERMINISTIC", "1")
    return Speaker().say(text, voice)


def _pcm(audio: np.ndarray) -> np.ndarray:
    return (np.clip(audio, -1, 1) * 32767).astype(np.int16)


@pytest.fixture(scope="module")
def native() -> Iterator[NativeModel]:
    """One load of the shipped model for the module (`shipped_model`); each run switches its checks."""
    with shipped_model() as model:
        yield model


@pytest.fixture(scope="module")
def checker(native: NativeModel) -> OverlapChecker:
    """The shipped model's own overlap checker (`OverlapChecker.for_mode("words")`: Whisper and the probe)."""
    c = native.floor.overlaps
    assert isinstance(c, OverlapChecker)
    c._ready.result(timeout=120)  # Whisper and the probe loaded: a cold start is late work, not this test's
    return c


def test_real_whisper_reads_the_overlap_once_there_is_enough_of_it(checker: OverlapChecker) -> None:
    lead = np.zeros(RATE // 5, np.float32)
    stop = _pcm(np.concatenate([lead, _say("Okay, stop.", "espeak:en-us")]))
    ov = checker.open(5, stop[: len(lead) + RATE // 2])
    assert ov.p_interrupt is not None and 0.0 <= ov.p_interrupt <= 1.0
    checker.ask(ov, 5, stop)
    ov.collect(6, wait=60)
    assert "stop" in ov.words.lower(), ov.words
    short = Overlap(opened=5, p_interrupt=None)
    checker.ask(short, 5, stop[: len(lead) + RATE // 8])  # 0.125 s: Whisper would make a word up
    short.collect(6, wait=60)
    assert short.words == "" and short.job is None
    assert checker.open(5, np.zeros(RATE, np.int16)).p_interrupt is None, "no speech: no early cue"
    # The same words 10 dB under the user's own voice (a television's level in FD-bench) are a bystander's.
    clip = stop[: len(lead) + RATE // 2]
    user_db = speech_db(resample(clip.astype(np.float32) / np.float32(32767), RATE, ASR_RATE))
    assert user_db is not None
    assert not checker.open(5, clip, user_db).bystander
    assert checker.open(5, (clip * 10 ** (-10 / 20)).astype(np.int16), user_db).bystander
    assert not checker.open(5, (clip * 10 ** (-10 / 20)).astype(np.int16), None).bystander, "no level: no gate"


def _stepped(model: NativeModel, sample: Path, name: str, after: int) -> str:
    """The sample's input stepped until `after` micro-turns past its overlap's start (its 5-7 s tail is
    not needed, and stepping it would cost the suite the time)."""
    audio, sr = read_wav(sample / "input.wav")
    return step_through(model, resample(audio, sr, RATE), name, ticks=_span(sample)[0] + after)


def _sample(out: Path, seed: int, task: str, number: int, spk: fdbench.Speaker,
            gap: tuple[float, float] = (2.0, 3.0)) -> Path:
    """Sample `number` of the generator's `task` set for `seed` (`generate(out, samples=0, v15_samples=number,
    seed=seed, tasks=(task,), overlap_gap=gap)`'s last one), made alone: each sample has a generator of its
    own, seeded by (seed, task, index), so the ones before it need not be made (~1 s of TTS each)."""
    folder = out / "v1.5" / task / str(number)
    folder.mkdir(parents=True)
    fdbench.overlap_sample(task, gap)(folder, random.Random(f"{seed}/{task}/{number - 1}"), spk)
    return folder


def _span(sample: Path) -> tuple[int, int]:
    start, end = json.loads((sample / "metadata.json").read_text())["timestamps"]
    return int(start / TICK_SECONDS), int(end / TICK_SECONDS)


@pytest.mark.timeout(400)
def test_the_shipped_model_talks_through_a_backchannel_with_the_check_and_still_stops_for_interruptions(
    tmp_path: Path, native: NativeModel,
) -> None:
    """The failure the check is for (README, *Backchannels*): in an FD-bench-layout sample (the generator,
    seed 4343: "Right." in espeak en-us+m3, 0.6 s into the reply) the shipped checkpoint alone stops for the
    listener's "Right." as for an interruption. With the cues it talks through it. Interruptions of the
    generator still stop it: "Hold on, ..." (seed 7373) at once, micro-turns sooner than the model alone (the
    probe is sure), and one that opens like a backchannel ("Okay stop, ...") once the words say so, within
    1 s."""
    os.environ.setdefault("DUPLEX_TTS_DETERMINISTIC", "1")
    # Each sample has a generator of its own (seed, task, index): the first few are those of any larger set.
    spk = fdbench.Speaker()
    right = _sample(tmp_path, 4343, "user_backchannel", 3, spk)
    interruptions = {"2": _sample(tmp_path, 4343, "user_interruption", 2, spk),
                     "hold": _sample(tmp_path / "7373", 7373, "user_interruption", 6, spk, gap=(0.6, 1.0))}
    assert json.loads((right / "metadata.json").read_text())["current_turn_text"] == "Right."
    said = {name: json.loads((s / "metadata.json").read_text())["current_turn_text"]
            for name, s in interruptions.items()}
    assert said["2"].startswith("Okay stop") and said["hold"].startswith("Hold on")
    runs: dict[str, str] = {}
    for mode, off in (("off", ("query", "overlaps")), ("words", ("query",))):  # --native-query heard
        with without(native, *off) as model:
            runs[mode] = _stepped(model, right, f"bc-{mode}", after=_span(right)[1] - _span(right)[0] + 2)
            for name, after in (("2", 5), ("hold", 2)) if mode == "words" else (("hold", 8),):
                runs[f"{name}-{mode}"] = _stepped(model, interruptions[name], name, after)
    start, end = _span(right)
    assert runs["off"][start] == "S" and runs["off"][end] == ".", f"no failure shown: {runs['off']}"
    assert runs["words"][start : end + 1] == "S" * (end + 1 - start), f"stopped for 'Right.': {runs['words']}"
    for name, within in (("2", 5), ("hold", 2)):
        start, _ = _span(interruptions[name])
        got = runs[f"{name}-words"][start : start + within]
        assert got.startswith("S") and "." in got, f"{said[name]!r} not stopped in {within} micro-turns: {got}"
    # "Hold on, ..." (seed 7373, espeak) sounds like an interruption from its first 100 ms (the probe is sure,
    # `STOP_P`): the stop comes when the overlap opens, micro-turns before the model alone gets to it.
    start, _ = _span(interruptions["hold"])
    alone, checked = (runs[f"hold-{m}"].index(".", start) for m in ("off", "words"))
    assert checked < alone, f"the probe's stop came no sooner: {runs['hold-off']} alone, {runs['hold-words']} checked"
