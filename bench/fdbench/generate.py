"""`generate`: a synthetic Full-Duplex-Bench set in the official v1.0 and v1.5 layouts.

Speech comes from the project's offline TTS (models.speech.tts) with several voices, rates and
pitches; texts, pauses and overlaps are drawn from one seeded generator, so the same seed gives the
same set. Inputs are 16 kHz mono PCM16 like the official data. Annotation files carry exactly the
official keys; what the generator knows beyond them (voice, texts, seed) goes to `generation.json`,
a name no official script reads.

Word timestamps in `transcription.json` are estimated (each utterance's span split in proportion to
word length), since the TTS does not report word alignments; the scorer never uses them.
"""

import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.fdbench import _texts
from bench.fdbench.layout import GENERATED_V1_TASKS, GT_DISTRIBUTION, V15_TASKS
from streaming.pcm import Audio
from streaming.resample import resample
from streaming.wav import write_wav

RATE = 16_000  # official inputs are 16 kHz
LEVEL_RMS = 0.08  # every utterance is brought to this RMS so voices are equally loud


@dataclass(frozen=True)
class Voice:
    voice: str  # a TTS voice name from list_voices()
    rate: float  # speaking-rate factor
    pitch: float  # pitch factor


class Speaker:
    """Text -> 16 kHz speech, trimmed of the TTS's own leading/trailing silence so spans are exact."""

    def __init__(self) -> None:
        try:
            from models.speech.tts import list_voices, synthesize
        except ImportError as e:
            raise RuntimeError(
                f"the project TTS (models.speech.tts) is not importable ({e}); install the project "
                "with its speech extras (piper-tts and a voice package)"
            ) from None
        self._synthesize = synthesize
        self.voices: list[str] = list(list_voices())
        if not self.voices:
            raise RuntimeError("models.speech.tts.list_voices() returned no voices; install a piper voice")

    def say(self, text: str, voice: Voice) -> Audio:
        audio, sr = self._synthesize(text, voice=voice.voice, rate=voice.rate, pitch=voice.pitch)
        audio = resample(np.asarray(audio, dtype=np.float32), int(sr), RATE)
        audio = _trim(audio)
        rms = float(np.sqrt(np.mean(audio**2))) if len(audio) else 0.0
        if rms > 0:
            audio = audio * np.float32(LEVEL_RMS / rms)
        return np.clip(audio, -0.99, 0.99).astype(np.float32)

    def random_voice(self, rng: random.Random) -> Voice:
        # Half the speakers use the natural Piper voice when there is one; the rest are spread over
        # the espeak voices, so a set has several distinct speakers.
        natural = [v for v in self.voices if v.startswith("piper:")]
        name = rng.choice(natural) if natural and rng.random() < 0.5 else rng.choice(self.voices)
        return Voice(name, round(rng.uniform(0.85, 1.15), 2), round(rng.uniform(0.85, 1.2), 2))


def _trim(audio: Audio, keep_s: float = 0.02) -> Audio:
    """Drop leading/trailing samples quieter than 2 % of the peak, keeping a few ms of margin."""
    if len(audio) == 0:
        return audio
    loud = np.flatnonzero(np.abs(audio) > 0.02 * float(np.max(np.abs(audio))))
    if len(loud) == 0:
        return audio
    pad = int(keep_s * RATE)
    return audio[max(0, loud[0] - pad) : loud[-1] + pad + 1]


@dataclass
class Track:
    """A mono timeline built left to right; `say` returns the utterance's [start, end] in seconds."""

    audio: list[Audio] = field(default_factory=list)
    samples: int = 0
    words: list[dict[str, Any]] = field(default_factory=list)  # official transcription chunks

    def silence(self, seconds: float) -> None:
        n = round(seconds * RATE)
        self.audio.append(np.zeros(n, dtype=np.float32))
        self.samples += n

    def say(self, speech: Audio, text: str) -> tuple[float, float]:
        start = self.samples / RATE
        self.audio.append(speech)
        self.samples += len(speech)
        end = self.samples / RATE
        self.words.extend(_estimate_words(text, start, end))
        return round(start, 3), round(end, 3)

    def render(self) -> Audio:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, dtype=np.float32)


def _estimate_words(text: str, start: float, end: float) -> list[dict[str, Any]]:
    words = text.split()
    weights = np.array([len(w) + 1 for w in words], dtype=np.float64)
    edges = start + (end - start) * np.concatenate([[0.0], np.cumsum(weights) / weights.sum()])
    return [{"text": w, "timestamp": [round(edges[i], 3), round(edges[i + 1], 3)]} for i, w in enumerate(words)]


def _mix(base: Audio, overlay: Audio, at_s: float, gain: float = 1.0) -> Audio:
    """`base` with `overlay` added from `at_s`, extended if the overlay runs past the end."""
    start = round(at_s * RATE)
    out = np.zeros(max(len(base), start + len(overlay)), dtype=np.float32)
    out[: len(base)] = base
    out[start : start + len(overlay)] += overlay * np.float32(gain)
    return np.clip(out, -1.0, 1.0)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")


def _transcription(track: Track) -> dict[str, Any]:
    return {"text": " ".join(w["text"] for w in track.words), "chunks": track.words}


# --- v1.0 tasks --------------------------------------------------------------------------------


def pause_sample(out: Path, rng: random.Random, spk: Speaker) -> dict[str, Any]:
    """One unfinished thought, a 1.5-3 s pause, its end, and a short tail."""
    voice = spk.random_voice(rng)
    head, tail = _texts.pause_text(rng)
    track = Track()
    track.silence(rng.uniform(0.3, 0.8))
    _, pause_start = track.say(spk.say(head, voice), head)
    track.silence(rng.uniform(1.5, 3.0))
    pause_end, _ = track.say(spk.say(tail, voice), tail)
    track.silence(rng.uniform(0.5, 1.0))
    write_wav(out / "input.wav", track.render(), RATE)
    _write_json(out / "pause.json", [{"text": "[PAUSE]", "timestamp": [pause_start, pause_end]}])
    _write_json(out / "transcription.json", _transcription(track))
    return {"voice": asdict(voice), "texts": [head, tail]}


def turn_taking_sample(out: Path, rng: random.Random, spk: Speaker) -> dict[str, Any]:
    """A lead-in and a question, then 5-7 s of silence for the model's answer."""
    voice = spk.random_voice(rng)
    lead, question = _texts.turn_text(rng)
    track = Track()
    track.silence(rng.uniform(0.3, 0.8))
    if lead:
        track.say(spk.say(lead, voice), lead)
        track.silence(rng.uniform(0.2, 0.5))
    _, user_end = track.say(spk.say(question, voice), question)
    track.silence(rng.uniform(5.0, 7.0))
    total = round(track.samples / RATE, 3)
    write_wav(out / "input.wav", track.render(), RATE)
    _write_json(out / "turn_taking.json", [{"text": "[TURN-TAKING]", "timestamp": [user_end, total]}])
    _write_json(out / "transcription.json", _transcription(track))
    return {"voice": asdict(voice), "texts": [lead, question]}


def interruption_sample(out: Path, rng: random.Random, spk: Speaker) -> dict[str, Any]:
    """A request, 3-5 s where the model answers, the user's interruption, then 5-7 s for the reply."""
    voice = spk.random_voice(rng)
    context, interrupt = _texts.interrupt_text(rng)
    context_audio, interrupt_audio = spk.say(context, voice), spk.say(interrupt, voice)
    track = Track()
    track.silence(rng.uniform(0.3, 0.8))
    track.say(context_audio, context)
    track.silence(rng.uniform(3.0, 5.0))
    start, end = track.say(interrupt_audio, interrupt)
    track.silence(rng.uniform(5.0, 7.0))
    write_wav(out / "input.wav", track.render(), RATE)
    write_wav(out / "context.wav", context_audio, RATE)
    write_wav(out / "interrupt.wav", interrupt_audio, RATE)
    _write_json(out / "interrupt.json", [{"context": context, "interrupt": interrupt, "timestamp": [start, end]}])
    return {"voice": asdict(voice), "texts": [context, interrupt]}


def backchannel_sample(out: Path, rng: random.Random, spk: Speaker) -> dict[str, Any]:
    """A 5-7 sentence story with 0.4-0.9 s breaks; the breaks are where backchannels belong."""
    voice = spk.random_voice(rng)
    track = Track()
    track.silence(rng.uniform(0.3, 0.8))
    breaks: list[tuple[float, float]] = []
    sentences = _texts.story(rng, rng.randint(5, 7))
    for i, sentence in enumerate(sentences):
        _, end = track.say(spk.say(sentence, voice), sentence)
        gap = rng.uniform(0.4, 0.9) if i < len(sentences) - 1 else rng.uniform(0.5, 1.0)
        track.silence(gap)
        breaks.append((end, end + gap))
    write_wav(out / "input.wav", track.render(), RATE)
    _write_json(out / "transcription.json", _transcription(track))
    return {"voice": asdict(voice), "texts": sentences, "gt": gt_distribution(breaks, track.samples / RATE)}


def gt_distribution(breaks: list[tuple[float, float]], clip_s: float, window: float = 0.2) -> list[float]:
    """Where a listener would backchannel: a Gaussian bump (sigma 0.3 s) at each break, in 0.2 s bins."""
    centres = (np.arange(int(clip_s / window) + 1) + 0.5) * window
    dist = np.zeros_like(centres)
    for start, end in breaks:
        dist += np.exp(-0.5 * ((centres - (start + end) / 2) / 0.3) ** 2)
    dist = dist + 1e-10
    return [round(float(v), 8) for v in dist / dist.sum()]


# --- v1.5 overlap subsets ----------------------------------------------------------------------


def overlap_sample(
    subset: str, gap: tuple[float, float] = (2.0, 3.0)
) -> Callable[[Path, random.Random, Speaker], dict[str, Any]]:
    """A question, 2-3 s of (expected) model answer, an overlap of the subset's kind, then a tail.

    `clean_input.wav` is the same timeline without the overlap.
    """

    def make(out: Path, rng: random.Random, spk: Speaker) -> dict[str, Any]:
        voice = spk.random_voice(rng)
        context = rng.choice(_texts.INTERRUPT_CONTEXTS + _texts.TURN_QUESTIONS)
        gain, other_voice, text = 1.0, voice, ""
        if subset == "user_interruption":
            text = rng.choice(_texts.INTERRUPT_TURNS)
        elif subset == "user_backchannel":
            text = rng.choice(_texts.USER_BACKCHANNELS)
        elif subset == "talking_to_other":
            text, gain = rng.choice(_texts.SIDE_REMARKS), 0.7
        else:  # background_speech: another voice, quieter, like a television
            text, gain = rng.choice(_texts.BACKGROUND_LINES), 0.3
            other_voice = spk.random_voice(rng)
        track = Track()
        track.silence(rng.uniform(0.3, 0.8))
        track.say(spk.say(context, voice), context)
        track.silence(rng.uniform(*gap))  # where the model answers; then the overlap
        at = track.samples / RATE
        overlay = spk.say(text, other_voice)
        track.silence(len(overlay) / RATE + rng.uniform(5.0, 7.0))
        clean = track.render()
        start, end = round(at, 3), round(at + len(overlay) / RATE, 3)
        write_wav(out / "clean_input.wav", clean, RATE)
        write_wav(out / "input.wav", _mix(clean, overlay, at, gain), RATE)
        _write_json(
            out / "metadata.json",
            {
                "context_text": context,
                "current_turn_text": text,
                "timestamps": [start, end],
                "tts_profiles": {
                    "clean_input": {"provider": "duplex-tts", "role": "primary", "profile": asdict(voice)},
                    "overlap": {"provider": "duplex-tts", "role": subset, "profile": asdict(other_voice)},
                },
            },
        )
        return {"voice": asdict(voice), "texts": [context, text], "overlap_gain": gain}

    return make


_V1_MAKERS: dict[str, Callable[[Path, random.Random, Speaker], dict[str, Any]]] = {
    "synthetic_pause_handling": pause_sample,
    "candor_turn_taking": turn_taking_sample,
    "synthetic_user_interruption": interruption_sample,
    "icc_backchannel": backchannel_sample,
}


def generate(
    out: Path,
    samples: int = 20,
    v15_samples: int = 5,
    seed: int = 0,
    tasks: tuple[str, ...] | None = None,
    overlap_gap: tuple[float, float] = (2.0, 3.0),
) -> list[Path]:
    """Write the set; returns the sample folders. v1.5 subsets go under `out/v1.5/`."""
    if samples < 0 or v15_samples < 0:
        raise ValueError("sample counts must be >= 0")
    if not 0 < overlap_gap[0] <= overlap_gap[1]:
        raise ValueError(f"--overlap-gap needs 0 < MIN <= MAX seconds, got {overlap_gap}")
    chosen = tasks or (*GENERATED_V1_TASKS, *V15_TASKS)
    unknown = [t for t in chosen if t not in GENERATED_V1_TASKS and t not in V15_TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; choose from {', '.join((*GENERATED_V1_TASKS, *V15_TASKS))}")
    spk = Speaker()
    jobs: list[tuple[str, Path, int]] = []
    for task in chosen:
        n, folder = (samples, out / task) if task in GENERATED_V1_TASKS else (v15_samples, out / "v1.5" / task)
        jobs.extend((task, folder / str(i + 1), i) for i in range(n))
    written: list[Path] = []
    gt: dict[str, list[float]] = {}
    for task, folder, i in tqdm(jobs, desc="generate", unit="sample"):
        # Each sample has its own generator so adding samples or tasks leaves the others unchanged.
        rng = random.Random(f"{seed}/{task}/{i}")
        folder.mkdir(parents=True, exist_ok=True)
        maker = _V1_MAKERS[task] if task in _V1_MAKERS else overlap_sample(task, overlap_gap)
        info = maker(folder, rng, spk)
        if "gt" in info:
            gt[folder.name] = info.pop("gt")
        _write_json(folder / "generation.json", {"seed": seed, "task": task, "index": i, **info})
        written.append(folder)
    if gt:
        _write_json(out / "icc_backchannel" / GT_DISTRIBUTION, gt)
    return written
