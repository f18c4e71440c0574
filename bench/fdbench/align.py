"""Time-aligned words and speech segments of an output, via the project's offline ASR and VAD.

`output.json` is written in the official schema: `{"text": ..., "chunks": [{"text": w, "timestamp":
[s, e]}]}`. For user interruption only the audio after the interruption ends is transcribed and the
timestamps are shifted back onto the input's timeline, exactly as the official `asr.py` does.
An `output.json` already present and newer than its wav (for instance one made with the official
parakeet ASR) is reused unless asked otherwise.
"""

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.fdbench.layout import Sample, SampleError
from bench.fdbench.metrics import Segment, Word
from streaming.pcm import Audio
from streaming.wav import read_wav

RATE = 16_000  # ASR and VAD both take 16 kHz
SILENT = 1e-4  # peak below this is digital silence: nothing to transcribe


def read_output(sample: Sample, name: str = "output.wav") -> Audio:
    path = sample.file(name)
    if not path.exists():
        raise SampleError(sample, f"missing {name}; run `python -m bench.fdbench run` on this set first")
    try:
        audio, _ = read_wav(path, rate=RATE)
    except Exception as e:  # soundfile raises several types for broken files
        raise SampleError(sample, f"{name} is not a readable wav ({e}); rerun the sample") from None
    return audio


def transcribe(audio: Audio, offset: float = 0.0) -> dict[str, Any]:
    """Official-schema transcript of 16 kHz audio, timestamps shifted by `offset` seconds."""
    words: list[tuple[str, float, float]] = []
    loud = np.flatnonzero(np.abs(audio) >= SILENT)
    if len(loud):
        from models.speech.asr import transcribe_words

        # Leading and trailing digital silence (a model's silent micro-turns are exact zeros) holds no
        # words; cropping it, with a margin, saves most of the ASR time on mostly-silent outputs.
        margin = int(0.3 * RATE)
        first, last = max(0, int(loud[0]) - margin), min(len(audio), int(loud[-1]) + margin)
        offset += first / RATE
        words = list(transcribe_words(audio[first:last], RATE))
    chunks = [{"text": w, "timestamp": [round(s + offset, 3), round(e + offset, 3)]} for w, s, e in words if w.strip()]
    return {"text": " ".join(w for w, _, _ in words if w.strip()), "chunks": chunks}


def words_of(sample: Sample, data: Any, name: str) -> list[Word]:
    """Validated words from an official-schema transcript."""
    try:
        chunks = data["chunks"]
        words = [
            Word(
                str(c["text"]),
                float(c["timestamp"][0]),
                None if c["timestamp"][1] is None else float(c["timestamp"][1]),
            )
            for c in chunks
        ]
    except (KeyError, IndexError, TypeError, ValueError):
        raise SampleError(
            sample,
            f"{name} does not follow the schema "
            '{"text": ..., "chunks": [{"text": w, "timestamp": [s, e]}]}; delete it to re-transcribe',
        ) from None
    return words


def output_words(
    sample: Sample, wav: str = "output.wav", crop_from: float | None = None, asr: str = "auto"
) -> list[Word]:
    """Words of an output, transcribing it (and writing the json) unless a fresh json exists.

    asr: "auto" reuses a json newer than the wav, "always" re-transcribes, "never" requires the json.
    """
    json_name = wav.rsplit(".", 1)[0] + ".json"
    json_path, wav_path = sample.file(json_name), sample.file(wav)
    fresh = json_path.exists() and (not wav_path.exists() or json_path.stat().st_mtime >= wav_path.stat().st_mtime)
    if asr == "never" or (asr == "auto" and fresh):
        if not json_path.exists():
            raise SampleError(sample, f"missing {json_name} and --asr never was given; drop --asr never to transcribe")
        try:
            data = json.loads(json_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SampleError(sample, f"{json_name} is not valid json ({e}); delete it to re-transcribe") from None
        return words_of(sample, data, json_name)
    audio = read_output(sample, wav)
    offset = 0.0
    if crop_from is not None:
        offset = max(0.0, crop_from)
        audio = audio[int(offset * RATE) :]
    data = transcribe(audio, offset)
    json_path.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")
    return words_of(sample, data, json_name)


def speech_segments(audio: Audio) -> list[Segment]:
    """Silero VAD segments (seconds) of 16 kHz audio; digital silence has none."""
    if len(audio) == 0 or float(np.max(np.abs(audio))) < SILENT:
        return []
    from models.speech.vad import speech_segments as vad

    return [(float(s), float(e)) for s, e in vad(audio, RATE)]


def clip_seconds(path: Path) -> float:
    import soundfile as sf

    info = sf.info(str(path))
    return float(info.frames) / float(info.samplerate)
