"""The offline speech components on real models and small synthesised clips."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from models.speech.asr import SphinxRecognizer, shared_pool, transcribe_words
from models.speech.tts import TTSError, list_voices, synthesize
from models.speech.vad import shared_vad, speech_segments
from streaming.resample import resample

SENTENCE = "What is the weather like in Paris today?"


@pytest.fixture(scope="module")
def clip() -> tuple[np.ndarray, int]:
    return synthesize(SENTENCE)


def test_piper_voice_speaks_and_rate_changes_duration(clip: tuple[np.ndarray, int]) -> None:
    audio, sr = clip
    assert sr == 22_050 and audio.dtype == np.float32 and audio.ndim == 1
    assert 1.0 < len(audio) / sr < 5.0 and 0.05 < np.abs(audio).max() <= 1.0
    fast, _ = synthesize(SENTENCE, rate=1.5)
    assert len(fast) < 0.85 * len(audio)
    high, _ = synthesize(SENTENCE, pitch=1.3)  # pitch by resampling: duration stays near
    assert 0.6 * len(audio) < len(high) < 1.4 * len(audio)


def test_piper_session_keeps_no_memory_arena(clip: tuple[np.ndarray, int]) -> None:
    """Each sentence length is a new shape; an arena would keep every shape's peak (models/speech/tts.py)."""
    from models.speech.tts import load_voice

    opts = load_voice("piper:joe")._voice.session.get_session_options()  # type: ignore[attr-defined]
    assert not opts.enable_cpu_mem_arena and not opts.enable_mem_pattern


def test_voices_are_listed_and_unknown_ones_are_named() -> None:
    voices = list_voices()
    assert "piper:joe" in voices
    with pytest.raises(TTSError, match="unknown voice 'nope:x'"):
        synthesize("hello", voice="nope:x")
    if "espeak:en-us" in voices:
        slow, sr = synthesize("hello there", voice="espeak:en-us", rate=0.7)
        fast, _ = synthesize("hello there", voice="espeak:en-us", rate=1.4)
        assert len(fast) < len(slow) and sr > 0


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs Debian's espeak-ng")
def test_espeak_reads_text_that_looks_like_an_option_as_words(tmp_path: Path) -> None:
    """Text reaches espeak-ng as data: "-f FILE" would read a file aloud and "-w FILE" write one."""
    target = tmp_path / "written.wav"
    lines = tmp_path / "long.txt"
    lines.write_text("this file is long and must never be read aloud. " * 60)
    said, sr = synthesize(f"-f{lines}", voice="espeak:en-us")
    assert 0 < len(said) / sr < 20.0  # the words of the path (a long tmp path: ~10 s), not the file (~60 s)
    synthesize(f"-w {target} hello", voice="espeak:en-us")
    assert not target.exists()


def test_asr_words_and_times(clip: tuple[np.ndarray, int]) -> None:
    audio, sr = clip
    words = transcribe_words(audio, sr)
    assert [w for w, _, _ in words] == ["what", "is", "the", "weather", "like", "in", "paris", "today"]
    starts = [s for _, s, _ in words]
    assert starts == sorted(starts) and all(s < e for _, s, e in words)
    assert words[-1][2] <= len(audio) / sr + 0.05


def test_streaming_asr_partials_grow_and_final_matches(clip: tuple[np.ndarray, int]) -> None:
    audio, sr = clip
    x = resample(audio, sr, 16_000)
    rec = SphinxRecognizer(shared_pool())
    rec.start()
    partials = [rec.feed(x[i : i + 3200]) for i in range(0, len(x), 3200)]
    final = rec.finish()
    assert "paris" in final.text and "weather" in final.text
    assert len(partials[1].split()) <= len(partials[-1].split())
    assert not rec.active


def test_vad_segments_find_the_speech(clip: tuple[np.ndarray, int]) -> None:
    audio, sr = clip
    gap = np.zeros(sr, dtype=np.float32)
    segs = speech_segments(np.concatenate([gap, audio, gap, audio, gap]), sr)
    assert len(segs) >= 2
    assert abs(segs[0][0] - 1.0) < 0.15
    assert segs[-1][1] < 1 + 2 * len(audio) / sr + 1 + 0.1
    assert speech_segments(np.zeros(sr * 2, dtype=np.float32), sr) == []


def test_vad_batch_gives_each_session_its_own_answer(clip: tuple[np.ndarray, int]) -> None:
    audio, sr = clip
    x = resample(audio, sr, 24_000)[: 4800 * 10]
    vad = shared_vad()
    alone = vad.open(24_000)
    batch = [vad.open(24_000) for _ in range(3)]
    inputs = [x, np.zeros_like(x), x[::-1].copy()]
    for i in range(0, len(x), 4800):
        a = vad.step([alone], [x[i : i + 4800]])[0]
        b = vad.step(batch, [inp[i : i + 4800] for inp in inputs])
        np.testing.assert_allclose(a, b[0], atol=1e-4)
        assert np.all(b[1] < 0.1)  # the silent session is not contaminated by its neighbours


def test_utterance_with_no_audio_finishes_empty_and_returns_its_decoder() -> None:
    """seg() is None for an utterance that heard nothing; that must not leak or poison the decoder."""
    from models.speech.asr import DecoderPool

    pool = DecoderPool(size=1)
    rec = SphinxRecognizer(pool)
    for _ in range(3):  # reusing the same decoder: a poisoned one crashed the process before
        rec.start()
        assert rec.finish().text == ""
    assert pool.built == 1 and pool.discarded == 0 and not rec.active
