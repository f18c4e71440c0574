"""Whisper on a window sized to the clip instead of its fixed 30 s: the same model, a fraction of the cost.

faster-whisper pads every clip to Whisper's 30 s window (3,000 mel frames), so a 2 s question costs the
encoder as much as 30 s of speech: ~0.47 s of one core for tiny.en here, ~85 % of a call. The encoder is
a plain transformer over the frames it is given, so a shorter window (whisper.cpp's `audio_ctx`) costs
in proportion: 10 s costs ~0.06 s. Three things keep the text as good as the full window's:
  1. the clip is padded with real silence (zero samples, before the log-mel, as Whisper's own padding
     is) to at least `MARGIN_S` past its end: with no margin the decoder of the short window loops on
     the last sentence (seen on a 7.9 s clip in a 7.9 s window);
  2. `LEAD_S` of silence goes before it: measured on 72 synthetic clips, word error 0.272 without it
     (mostly loops) and 0.056 with it, against 0.067 for faster-whisper's 30 s window;
  3. a transcript that still repeats itself (a run of `LOOP_WORDS` words said twice, a last word that
     echoes one of the two before it, or a gzip compression ratio over `MAX_COMPRESSION`, the
     threshold faster-whisper uses for its fallback) is decoded again in the full window. The n-gram
     test is what catches a short loop: "I just got back from a long walk. How long should I ... I
     just got back from a long walk. How long" compresses by less than 2.4. The echo test catches the
     shortest: a clip cut in a pause after "... for dinner and" came back as "... for dinner and
     dinner." (a finished sentence, so the turn was ended mid-sentence); the full window heard "and...".
     A real ending like "more and more." only costs the second decode.
`bench.asr_wer` measures word error and cost of both (README, voice section).

Model code only: audio in, text out; the caller owns threads (CTranslate2 releases the GIL).
"""

from __future__ import annotations

import math
import re
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt

from models.speech.sphinx import ASR_RATE
from streaming.types import Audio

FULL_S = 30  # Whisper's own window
WINDOW_STEP_S = 10  # windows come in steps of this many seconds (few distinct encoder shapes)
MARGIN_S = 2.0  # silence after the clip inside the window
LEAD_S = 0.3  # silence before the clip
MAX_SAMPLES = int((FULL_S - LEAD_S) * ASR_RATE)  # the longest clip one window holds (16 kHz samples)
MAX_COMPRESSION = 2.4  # gzip ratio above which a transcript is a loop (faster-whisper's threshold)
LOOP_WORDS = 5  # a run of this many words said twice is taken for a decoding loop
TOKENS_PER_S = 12  # decode bound: speech is ~3-4 tokens a second; a loop stops here, not at 448
MAX_TOKENS = 448  # Whisper's decoder context
_ENCODER_HOP = 320  # samples per encoder frame (10 ms mel frames, stride-2 convolution)


def window_seconds(samples: int) -> int:
    """The window a clip of `samples` (16 kHz) is decoded in: clip + margin, in steps, at most 30 s."""
    need = LEAD_S + samples / ASR_RATE + MARGIN_S
    return min(FULL_S, WINDOW_STEP_S * max(1, math.ceil(need / WINDOW_STEP_S)))


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def looks_looped(text: str) -> bool:
    """A decoding loop: some run of `LOOP_WORDS` words occurs twice, the last word echoes one of the
    two before it, or the text compresses too well."""
    words = re.sub(r"[^\w\s']", " ", text.lower()).split()
    if len(words) >= 2 and words[-1] in words[-3:-1]:
        return True
    seen: set[tuple[str, ...]] = set()
    for i in range(len(words) - LOOP_WORDS + 1):
        gram = tuple(words[i : i + LOOP_WORDS])
        if gram in seen:
            return True
        seen.add(gram)
    return compression_ratio(text) > MAX_COMPRESSION


class WindowedWhisper:
    """Greedy, timestamp-free English transcription of one clip of at most 30 s.

    `model` is a loaded `faster_whisper.WhisperModel`: its CTranslate2 model, feature extractor and
    tokenizer are used directly, since its `transcribe` always pads to 30 s.
    """

    def __init__(self, model: Any) -> None:
        from faster_whisper.tokenizer import Tokenizer

        self._ct2 = model.model
        self._features = model.feature_extractor
        multilingual = bool(getattr(model.model, "is_multilingual", False))
        self._tok = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe", language="en")
        self._prompt = [*self._tok.sot_sequence, self._tok.no_timestamps]

    def transcribe(self, audio: Audio, full: bool = False) -> str:
        """The clip's text (`full`: in Whisper's 30 s window, as faster-whisper would decode it)."""
        x = np.asarray(audio, dtype=np.float32).reshape(-1)[:MAX_SAMPLES]
        seconds = FULL_S if full else window_seconds(len(x))
        text = self._decode(x, seconds)
        if not full and seconds < FULL_S and looks_looped(text):
            text = self._decode(x, FULL_S)
        return text

    def encode(self, audio: Audio, seconds: float, lead_s: float = LEAD_S) -> npt.NDArray[np.float32]:
        """The encoder's output for the clip placed `lead_s` into a `seconds` window (its end kept if it
        does not fit): float32[frames, width], 20 ms a frame; only the frames that hold the clip."""
        lead = round(lead_s * ASR_RATE)
        x = np.asarray(audio, dtype=np.float32).reshape(-1)[-(round(seconds * ASR_RATE) - lead) :]
        encoded = np.asarray(self._encode(x, seconds, lead, to_cpu=True))[0]
        first, last = lead // _ENCODER_HOP, -(-(lead + len(x)) // _ENCODER_HOP)
        return encoded[first : max(first + 1, last)].astype(np.float32)

    def _encode(self, x: Audio, seconds: float, lead: int, to_cpu: bool) -> Any:
        import ctranslate2

        padded = np.zeros(round(seconds * ASR_RATE), dtype=np.float32)
        padded[lead : lead + len(x)] = x
        mel = self._features(padded, padding=0)[:, : round(seconds * 100)]  # [80, frames], 10 ms frames
        features = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel[None], dtype=np.float32))
        return self._ct2.encode(features, to_cpu=to_cpu)

    def _decode(self, x: Audio, seconds: int) -> str:
        encoded = self._encode(x, seconds, round(LEAD_S * ASR_RATE), to_cpu=False)
        limit = min(MAX_TOKENS, len(self._prompt) + 8 + int(TOKENS_PER_S * len(x) / ASR_RATE))
        result = self._ct2.generate(
            encoded, [self._prompt], beam_size=1, max_length=limit, suppress_blank=True, suppress_tokens=[-1]
        )[0]
        ids = [t for t in result.sequences_ids[0] if t < self._tok.eot]
        return str(self._tok.decode(ids)).strip()
