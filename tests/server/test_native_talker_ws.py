"""The shipped native:tiny with the Piper talker behind the real server: a spoken question gets words."""

from collections.abc import Callable

import numpy as np
import pytest

from models.interaction.phrases import TRAINED_REPLIES
from models.speech.asr import transcribe
from streaming.pcm import float32_to_pcm16, pcm16_to_float32
from tests.conftest import ServerProc
from tests.wsclient import b64, collect_audio, send, start_session
from train.episodes import Speaker
from train.evaluate import word_errors

ENV = {"DUPLEX_TORCH_THREADS": "1", "DUPLEX_KV_BUDGET_MB": "64"}
RATE, TURN = 24_000, 4_800


def _words(text: str) -> list[str]:
    return [w.strip(".,?!").lower() for w in text.split()]


@pytest.mark.timeout(300)
async def test_native_tiny_with_piper_answers_a_question_with_speech(duplex_server: Callable[..., ServerProc],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUPLEX_TTS_DETERMINISTIC", "1")  # this test's question only, not the rest of the suite
    question = Speaker().say("Could you tell me what time the bakery opens tomorrow?", "espeak:en-us")
    audio = np.concatenate([np.zeros(RATE // 2, np.float32), question, np.zeros(3 * RATE, np.float32)])
    n = -(-len(audio) // TURN)
    audio = np.pad(audio, (0, n * TURN - len(audio)))
    # --max-sessions and --phase-groups given: no start-up calibration (~6 s on the shared test box).
    server = duplex_server("--model", "native:tiny", "--voice", "piper", "--max-sessions", "1",
                           "--phase-groups", "1", "--background", "none", env=ENV)
    ws, _ = await start_session(server.ws_url, pace="media")
    for k in range(n):
        chunk = float32_to_pcm16(audio[k * TURN : (k + 1) * TURN])
        await send(ws, {"type": "input_audio_buffer.append", "audio": b64(chunk)})
    out = await collect_audio(ws, n, timeout=120)
    await ws.close()
    assert "speaks with Piper (the talker) (--voice piper)" in server.log(), "start-up says which voice and why"
    reply = np.concatenate([pcm16_to_float32(out[k]) for k in range(n)])
    heard = transcribe(reply, RATE)
    # The model picks the phrase; whichever it is, Whisper tiny.en must hear that phrase's words.
    best = min(TRAINED_REPLIES, key=lambda p: word_errors(p, heard)[0] / len(_words(p)))
    errors, words = word_errors(best, heard)
    assert len(_words(heard)) >= 3 and errors / words <= 0.4, f"heard {heard!r}; nearest phrase {best!r}"
