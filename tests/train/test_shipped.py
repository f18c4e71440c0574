"""The committed native:tiny checkpoint: loads by default, and behaves through the real server."""

import itertools
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from models.interaction.checkpoint import build, read_metadata, shipped_checkpoint
from models.interaction.phrases import MAX_CHAINED, TRAINED_REPLIES
from models.speech.asr import transcribe
from streaming.pcm import float32_to_pcm16, pcm16_to_float32
from tests.conftest import ServerProc, start_server
from tests.server._background_stub import ScriptedOpenAI
from tests.wsclient import b64, collect_audio, send, start_session
from train.episodes import Speaker
from train.evaluate import word_errors

ENV = {"DUPLEX_TORCH_THREADS": "1", "DUPLEX_KV_BUDGET_MB": "64"}
RATE, TURN = 24_000, 4_800


def test_shipped_checkpoint_loads_by_default_without_warning() -> None:
    path = shipped_checkpoint("tiny")
    assert path is not None, "models/interaction/weights/native-tiny.safetensors must ship"
    assert path.stat().st_size < 25 * 2**20
    meta = read_metadata(path)
    assert "duplex train" in meta["command"] and meta["data_seed"] and len(meta["commit"]) == 40
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the random-weights warning would raise here
        net = build("tiny", None)
    assert next(net.parameters()).abs().sum() > 0
    assert net.cfg.heard_tokens == 4, "it reads the words pocketsphinx hears (models/interaction/heard.py)"
    assert float(meta["phrase_word_error"]) > 0.15, "its flow head has not earned the voice: --voice auto gives Piper"
    assert "onset_threshold" not in meta, "greedy by default: at its calibrated 0.55 it drops questions (README)"


def _speech(text: str, voice: str = "espeak:en-us") -> np.ndarray:
    os.environ.setdefault("DUPLEX_TTS_DETERMINISTIC", "1")
    return Speaker().say(text, voice)


async def _play(url: str, audio: np.ndarray) -> list[np.ndarray]:
    """Send audio in 200 ms chunks at media pace; per micro-turn: what the model played (float32)."""
    n = -(-len(audio) // TURN)
    audio = np.pad(audio, (0, n * TURN - len(audio)))
    ws, _ = await start_session(url, pace="media")
    for k in range(n):
        chunk = float32_to_pcm16(audio[k * TURN : (k + 1) * TURN])
        await send(ws, {"type": "input_audio_buffer.append", "audio": b64(chunk)})
    out = await collect_audio(ws, n, timeout=120)
    await ws.close()
    return [pcm16_to_float32(out[k]) for k in range(n)]


async def _stream(url: str, audio: np.ndarray) -> list[bool]:
    """Per micro-turn: did the model make a sound?"""
    return [bool(a.any()) for a in await _play(url, audio)]


def _native(tmp_path: Path, *args: str) -> ServerProc:
    """--max-sessions and --phase-groups given: no start-up calibration (a start still costs ~5 s: the
    model, the recogniser's worker process, the talker's phrases)."""
    return start_server("--model", "native:tiny", "--max-sessions", "2", "--phase-groups", "1", *args,
                        tmp_path=tmp_path, env=ENV)


@pytest.fixture(scope="module")
def reasoner() -> Iterator[ScriptedOpenAI]:
    """The background reasoner: an OpenAI-compatible server on loopback giving one result."""
    scripted = ScriptedOpenAI(answer="The pool closes at nine.").start()
    yield scripted
    scripted.stop()


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory, reasoner: ScriptedOpenAI) -> Iterator[ServerProc]:
    """One server for the module's conversations as shipped, each its own session, with a background
    reasoner to hand look-ups to (a start costs ~5 s idle, ~20 s on the loaded box: one for the module)."""
    server = _native(tmp_path_factory.mktemp("native"), "--background", "openai", "--background-url",
                     reasoner.base_url, "--background-model", "scripted")
    yield server
    server.stop()


def _words(text: str) -> list[str]:
    return [w.strip(".,?!").lower() for w in text.split()]


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.float32)  # exact zeros, as a muted or file-fed mic sends


@pytest.mark.timeout(300)
async def test_shipped_model_replies_to_a_question_with_words_and_not_before(
    native: ServerProc, reasoner: ScriptedOpenAI,
) -> None:
    """An espeak question after 0.6 s of silence: silent through both, a reply within 2 s, and in Piper's
    voice (`--voice auto`: its flow head has not earned it) words Whisper tiny.en hears as the phrase."""
    question = _speech("Could you tell me what time the bakery opens tomorrow?")
    asked = len(reasoner.requests)
    played = await _play(native.ws_url, np.concatenate([_silence(0.6), question, _silence(3.0)]))
    assert len(reasoner.requests) == asked, f"it handed the question off: {reasoner.requests[-1]}"
    spoken = [bool(a.any()) for a in played]
    end = int((0.6 * RATE + len(question)) // TURN)
    assert not any(spoken[: end - 2]), f"spoke in the leading silence or over the question: {spoken}"
    assert any(spoken[end : end + 10]), f"no reply within 2 s after the question: {spoken}"
    assert "speaks with Piper (the talker) (auto:" in native.log(), "start-up says which voice and why"
    assert "takes the turn with the verdict of Whisper" in native.log(), "the turn check is on by default"
    assert "goes on speaking through what the overlap probe" in native.log(), "so is the overlap check"
    heard = transcribe(np.concatenate(played), RATE)
    # The model picks its phrases (a reply chains up to MAX_CHAINED of them); whichever they are, Whisper
    # tiny.en must hear their words.
    chains = [" ".join(c) for n in range(1, MAX_CHAINED + 1) for c in itertools.product(TRAINED_REPLIES, repeat=n)]
    best = min(chains, key=lambda p: word_errors(p, heard)[0] / len(_words(p)))
    errors, words = word_errors(best, heard)
    assert len(_words(heard)) >= 3 and errors / words <= 0.4, f"heard {heard!r}; nearest phrase {best!r}"


@pytest.mark.timeout(300)
async def test_shipped_model_waits_through_a_mid_sentence_pause(native: ServerProc) -> None:
    """An unfinished clause in an espeak voice, then 2.4 s of silence: it waits."""
    head = _speech("Yesterday I went to the market because")
    spoken = await _stream(native.ws_url, np.concatenate([_silence(0.6), head, _silence(2.4)]))
    end = int((0.6 * RATE + len(head)) // TURN)
    assert not any(spoken[end + 2 :]), f"did not wait through the mid-sentence pause: {spoken}"


@pytest.mark.timeout(300)
async def test_shipped_model_hands_a_look_up_to_the_reasoner_and_answers_a_question_itself(
    native: ServerProc, reasoner: ScriptedOpenAI,
) -> None:
    """Served as shipped. A look-up request in an espeak voice, then silence: its words ask for a look-up
    (turn_check.py), so the floor the model takes is a hand-off to the background reasoner (an
    OpenAI-compatible server on loopback giving one result), and when the result has streamed into its
    background channel it says it, word for word, in Piper's voice: Whisper hears the result's words in
    what the client got. Then, in another session, a plain question in another voice, one the model alone
    handed off (bench.native.handoff, before the words settled it): answered by the model, not handed off."""
    before = len(reasoner.requests)
    request = _speech("Can you check when the swimming pool closes?")  # one of train/_texts.LOOKUPS
    played = await _play(native.ws_url, np.concatenate([_silence(0.6), request, _silence(7.0)]))
    asked_first = len(reasoner.requests)
    question = _speech("Why do people enjoy watching the sea?", "espeak:en-029")
    replied = await _stream(native.ws_url, np.concatenate([_silence(0.6), question, _silence(3.0)]))
    assert asked_first > before, "it never handed the request to the reasoner"
    assert len(reasoner.requests) == asked_first, f"it handed the question off too: {reasoner.requests[-1]}"
    q_end = int((0.6 * RATE + len(question)) // TURN)
    assert any(replied[q_end : q_end + 10]), f"the question went unanswered: {replied}"
    # The request is the user's words as Whisper heard them (--native-query auto: models/interaction/query.py),
    # not pocketsphinx's guesses for an espeak voice.
    asked = _words(reasoner.requests[before]["messages"][-1]["content"])
    assert {"swimming", "pool", "closes"} <= set(asked), f"the reasoner was asked {asked!r}"
    end = int((0.6 * RATE + len(request)) // TURN)
    heard = transcribe(np.concatenate(played[end:]), RATE)
    # "pool" and "closes" are in no phrase of its set: they come from the background stream it read.
    assert {"found", "pool", "closes"} <= set(_words(heard)), f"the answer was not spoken: Whisper heard {heard!r}"
