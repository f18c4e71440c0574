"""Seeded synthetic full-duplex episodes: two channels (user mic, assistant) and per-micro-turn labels.

An episode is a chain of scenes on one timeline of exactly `ticks` micro-turns (200 ms each):

    qa          the user asks, yields; the assistant replies a moment later (mostly two or three phrases)
    pause       an unfinished clause, 1.2-3 s of silence, its end; the assistant waits, then replies
    barge_in    the assistant gives a long answer; the user talks over it; it stops within a micro-turn
                (a third of them: the "wait, ..." comes after a short reply ended; it answers)
    user_bc     the user says "mm-hm" while the assistant talks; it keeps talking
    overheard   quieter speech not addressed to the assistant (another voice); it keeps its course
    story       a long user turn; the assistant backchannels in the breaks, replies at the end
    typed       a typed message instead of speech; the assistant replies
    delegate    a look-up request: delegate (mostly saying "one moment"), wait for the result, say it
    quiet       silence and noise only

The assistant always speaks in Piper joe's voice (its target mel), placed on whole micro-turns
because that is how the model emits audio. The user side varies: Piper joe and espeak-ng voices, with
rate, pitch, gain and noise jitter. Everything is drawn from one `random.Random(seed)`.
"""

import random
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from models.interaction.config import ACTIONS
from streaming.types import SAMPLE_RATE, TICK_SAMPLES, Audio
from train import _texts as tx

LEVEL_RMS = 0.08  # speech level before the per-speaker gain
SPEAK, SILENT, BACKCHANNEL, YIELD, DELEGATE = (ACTIONS.index(a) for a in ACTIONS)
USER_VOICES = (
    "piper:joe",
    "espeak:en-us",
    "espeak:en-gb",
    "espeak:en-gb-scotland",
    "espeak:en-029",
    "espeak:en-us+f3",
    "espeak:en-us+m3",
    "espeak:en-gb+f2",
)
ASSISTANT_VOICE = "piper:joe"
# A third of the users speak in Piper's voice, the rest in espeak's seven. The recogniser behind the
# heard-words channel gets most of espeak's words wrong and more of Piper's right: with one user in
# eight a Piper voice, the channel's last word was mostly noise in training, the model learnt to
# barely read it, and a pause after "... we could" heard right was still taken.
USER_VOICE_WEIGHTS = tuple(0.5 * (len(USER_VOICES) - 1) if v.startswith("piper") else 1.0 for v in USER_VOICES)


class Speaker:
    """TTS with a per-process cache: episodes reuse phrases, and the assistant's are always the same."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str, float, float], Audio] = {}

    def say(self, text: str, voice: str, rate: float = 1.0, pitch: float = 1.0) -> Audio:
        key = (text, voice, rate, pitch)
        if key not in self._cache:
            from models.speech.tts import synthesize
            from streaming.resample import resample

            audio, sr = synthesize(text, voice=voice, rate=rate, pitch=pitch)
            audio = _trim(resample(np.asarray(audio, dtype=np.float32), int(sr), SAMPLE_RATE))
            rms = float(np.sqrt(np.mean(audio**2))) if len(audio) else 0.0
            if rms > 0:
                audio = audio * np.float32(LEVEL_RMS / rms)
            self._cache[key] = np.clip(audio, -0.99, 0.99).astype(np.float32)
        return self._cache[key]


def _trim(audio: Audio) -> Audio:
    """Drop leading/trailing samples under 2 % of the peak (keep 20 ms): onsets then mean speech."""
    loud = np.flatnonzero(np.abs(audio) > 0.02 * float(np.max(np.abs(audio), initial=0.0)))
    if len(loud) == 0:
        return audio
    pad = SAMPLE_RATE // 50
    return audio[max(0, loud[0] - pad) : loud[-1] + pad + 1]


@dataclass
class Segment:
    """One assistant utterance, placed on micro-turn boundaries."""

    start: int  # first micro-turn
    audio: Audio  # assistant speech (24 kHz), cut short if it was interrupted
    text: str
    kind: int  # SPEAK or BACKCHANNEL

    @property
    def ticks(self) -> int:
        return -(-len(self.audio) // TICK_SAMPLES)


@dataclass
class Episode:
    seed: int
    ticks: int
    user: Audio  # [ticks * TICK_SAMPLES] the mic: the user's speech, overheard speech, noise
    assistant: list[Segment] = field(default_factory=list)
    control: npt.NDArray[np.int8] = field(init=False)  # [ticks] action labels (ACTIONS order)
    user_speaking: npt.NDArray[np.uint8] = field(init=False)  # [ticks]
    user_text: list[tuple[int, int, str]] = field(default_factory=list)  # (first tick, last tick, text)
    typed: list[tuple[int, str]] = field(default_factory=list)  # (tick it arrives, text)
    background: list[tuple[int, str]] = field(default_factory=list)  # (tick it arrives, result text)
    scenes: list[str] = field(default_factory=list)
    # (first silent micro-turn, first micro-turn of the continuation) of each mid-sentence pause
    pauses: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.control = np.full(self.ticks, SILENT, dtype=np.int8)
        self.user_speaking = np.zeros(self.ticks, dtype=np.uint8)


class _Builder:
    """Lays scenes out left to right; `t` is the cursor in samples on the user timeline."""

    def __init__(self, seed: int, ticks: int, speaker: Speaker) -> None:
        self.rng = random.Random(seed)
        self.spk = speaker
        self.ep = Episode(seed, ticks, np.zeros(ticks * TICK_SAMPLES, dtype=np.float32))
        self.t = 0
        r = self.rng
        voice = r.choices(USER_VOICES, USER_VOICE_WEIGHTS)[0]
        self.voice = (voice, round(r.uniform(0.85, 1.2), 2), round(r.uniform(0.85, 1.2), 2))
        self.gain = r.uniform(0.5, 1.3)
        others = [v for v in USER_VOICES if v.startswith("espeak") and v != self.voice[0]]
        self.other_voice = r.choice(others)

    @property
    def end(self) -> int:
        return self.ep.ticks * TICK_SAMPLES

    def full(self) -> bool:
        return self.t >= self.end - 2 * SAMPLE_RATE  # < 2 s left: stop adding scenes

    def tick_of(self, sample: int) -> int:
        return min(sample // TICK_SAMPLES, self.ep.ticks - 1)

    def gap(self, lo: float, hi: float) -> None:
        self.t += int(self.rng.uniform(lo, hi) * SAMPLE_RATE)

    def user_says(self, text: str, at: int | None = None, gain: float = 1.0, addressed: bool = True) -> int:
        """Mix the user's (or, addressed=False, someone else's) speech in at `at` (default: cursor);
        returns the sample where it ends. Marks user-speaking on ticks it covers by >= 25 %."""
        voice, rate, pitch = self.voice if addressed else (self.other_voice, 1.0, 1.0)
        audio = self.spk.say(text, voice, rate, pitch) * np.float32(gain * (self.gain if addressed else 1.0))
        start = self.t if at is None else at
        stop = min(start + len(audio), self.end)
        if stop <= start:
            return start
        self.ep.user[start:stop] += audio[: stop - start]
        if addressed:
            first, last = self.tick_of(start), self.tick_of(stop - 1)
            for n in range(first, last + 1):
                covered = min(stop, (n + 1) * TICK_SAMPLES) - max(start, n * TICK_SAMPLES)
                if covered >= TICK_SAMPLES // 4:
                    self.ep.user_speaking[n] = 1
            self.ep.user_text.append((first, last, text))
        return stop

    def assistant_says(self, tick: int, text: str, kind: int = SPEAK) -> Segment | None:
        if tick >= self.ep.ticks:
            return None
        audio = self.spk.say(text, ASSISTANT_VOICE)
        seg = Segment(tick, audio[: (self.ep.ticks - tick) * TICK_SAMPLES], text, kind)
        self.ep.assistant.append(seg)
        self.ep.control[tick : tick + seg.ticks] = kind
        return seg

    def cut(self, seg: Segment, tick: int) -> None:
        """The user barged in at `tick`: the assistant yields there and says nothing more."""
        keep = max(tick - seg.start, 0)
        self.ep.control[seg.start + keep : seg.start + seg.ticks] = SILENT
        seg.audio = seg.audio[: keep * TICK_SAMPLES]
        self.ep.control[tick] = YIELD

    def onset_after(self, user_end: int) -> int:
        """The micro-turn a reply starts in: 2-3 after the one the user's speech ends in (0.2-0.6 s of
        silence). Not sooner: a checkpoint with the heard-words channel (`heard_tokens`) gets the last
        word the micro-turn after it ends (`heard_stream`), and a reply it must take before the word
        arrives can only be decided from the audio, which is where mid-sentence pauses fail."""
        return self.tick_of(user_end) + self.rng.choice((2, 2, 3))

    def reply_after(self, user_end: int, text: str | None = None) -> int:
        """The assistant takes the floor at `onset_after(user_end)`; returns the sample where its reply
        ends (the cursor moves past it)."""
        tick = self.onset_after(user_end)
        seg = self.assistant_says(tick, text or self.rng.choice(tx.REPLIES))
        self.t = (tick + (seg.ticks if seg else 0)) * TICK_SAMPLES
        return self.t

    def long_reply(self) -> str:
        return " ".join(self.rng.sample(tx.REPLIES, self.rng.choice((2, 3))))


def _question(b: _Builder) -> str:
    return (b.rng.choice(tx.LEADS) + " " + b.rng.choice(tx.QUESTIONS)).strip()


def scene_qa(b: _Builder) -> None:
    # Now and then a finished statement instead of a question: the same clauses end the pause scene's
    # unfinished heads, so only their last words tell the two apart.
    if b.rng.random() < 0.3:
        b.reply_after(b.user_says(b.rng.choice(tx.STATEMENTS)))
        return
    end = b.user_says(_question(b))
    # Most questions get an answer of two or three phrases, as a person's would: with one phrase the
    # reply ended before anything could overlap it, so the model never practised talking through a
    # listener's "mm-hm" or stopping for a "wait" in the conversations it was served (FD-bench v1.5's
    # overlaps come 2-3 s after the question; one phrase is over by then).
    b.reply_after(end, b.long_reply() if b.rng.random() < 0.6 else None)


def scene_pause(b: _Builder) -> None:
    end = b.user_says(b.rng.choice(tx.HEADS))
    b.t = end + int(b.rng.uniform(1.2, 3.0) * SAMPLE_RATE)  # labels stay silent through the pause
    b.ep.pauses.append((b.tick_of(end) + 1, b.tick_of(b.t)))
    b.reply_after(b.user_says(b.rng.choice(tx.TAILS)))


def scene_barge_in(b: _Builder) -> None:
    end = b.user_says(_question(b))
    if b.rng.random() < 0.35:
        # The redirect comes after a short reply has already ended (or after a question it left to the
        # background): nothing to stop, and the words after the "wait" still want an answer. Without
        # this, every "wait, ..." of training came while the assistant talked, and the same words into
        # its silence (FD-bench's interruptions after a reply one phrase long) were answered by chance.
        b.reply_after(end)
        b.gap(0.6, 4.0)
        b.reply_after(b.user_says(b.rng.choice(tx.BARGE_INS)))
        return
    tick = b.onset_after(end)
    seg = b.assistant_says(tick, b.long_reply())
    if seg is None:
        return
    into = b.rng.randint(3, max(3, min(seg.ticks - 2, 12)))  # micro-turns of its answer before the barge-in
    onset = (tick + into) * TICK_SAMPLES + b.rng.randint(0, TICK_SAMPLES - 1)
    if onset >= b.end - TICK_SAMPLES:
        b.t = b.end
        return
    stop = b.user_says(b.rng.choice(tx.BARGE_INS), at=onset)
    # It stops the micro-turn after the one the barge-in starts in (two after, if the user was heard for
    # under 50 ms in that one): 0.2-0.45 s of the user's speech. Not at its first micro-turn: a
    # backchannel ("Yeah.", scene_user_backchannel) starts just the same, and the assistant keeps talking
    # through that one; by the next micro-turn the speech has gone on, or its first word has come.
    yield_tick = onset // TICK_SAMPLES + 1 + (1 if onset % TICK_SAMPLES > TICK_SAMPLES - SAMPLE_RATE // 20 else 0)
    b.cut(seg, min(yield_tick, b.ep.ticks - 1))
    b.t = stop
    b.reply_after(stop)


def scene_user_backchannel(b: _Builder) -> None:
    end = b.user_says(_question(b))
    tick = b.onset_after(end)
    seg = b.assistant_says(tick, b.long_reply())
    if seg is None:
        return
    at = (tick + b.rng.randint(2, max(2, seg.ticks - 3))) * TICK_SAMPLES + b.rng.randint(0, TICK_SAMPLES - 1)
    if at < b.end:
        b.user_says(b.rng.choice(tx.USER_BACKCHANNELS), at=at, gain=b.rng.uniform(0.6, 1.0))
    b.t = (tick + seg.ticks) * TICK_SAMPLES


def scene_overheard(b: _Builder) -> None:
    gain = b.rng.uniform(0.15, 0.35)
    if b.rng.random() < 0.5:  # while the assistant talks
        end = b.user_says(_question(b))
        tick = b.onset_after(end)
        seg = b.assistant_says(tick, b.long_reply())
        if seg is None:
            return
        at = (tick + 1) * TICK_SAMPLES + b.rng.randint(0, 2 * TICK_SAMPLES)
        if at < b.end:
            b.user_says(b.rng.choice(tx.OVERHEARD), at=at, gain=gain, addressed=False)
        b.t = (tick + seg.ticks) * TICK_SAMPLES
    else:  # while nobody talks to it
        b.t = b.user_says(b.rng.choice(tx.OVERHEARD), gain=gain, addressed=False)


def scene_story(b: _Builder) -> None:
    start = b.rng.randrange(len(tx.STORY))
    n = b.rng.choice((2, 3, 4))
    for i in range(n):
        end = b.user_says(tx.STORY[(start + i) % len(tx.STORY)])
        if i == n - 1 or end >= b.end - TICK_SAMPLES:
            b.reply_after(end)
            return
        brk = int(b.rng.uniform(0.5, 1.0) * SAMPLE_RATE)
        if b.rng.random() < 0.7:  # a backchannel in this break, starting right after the sentence
            b.assistant_says(b.tick_of(end) + 1, b.rng.choice(tx.BACKCHANNELS), BACKCHANNEL)
            seg = b.ep.assistant[-1] if b.ep.assistant else None
            if seg is not None:
                brk = max(brk, (seg.start + seg.ticks) * TICK_SAMPLES - end)
        b.t = end + brk


def scene_typed(b: _Builder) -> None:
    text = b.rng.choice(tx.TYPED)
    tick = b.tick_of(b.t)
    b.ep.typed.append((tick, text))
    last = tick + -(-(len(text.encode()) + 1) // 4)  # 4 typed bytes per micro-turn, newline included
    b.reply_after(last * TICK_SAMPLES)


def scene_delegate(b: _Builder) -> None:
    i = b.rng.randrange(len(tx.LOOKUPS))
    end = b.user_says(tx.LOOKUPS[i])
    tick = b.onset_after(end)
    if tick >= b.ep.ticks:
        b.t = b.end
        return
    b.ep.control[tick] = DELEGATE
    arrive = tick + b.rng.randint(5, 12)  # the reasoner answers 1-2.4 s later
    result = tx.RESULTS[i]
    b.ep.background.append((arrive, result))
    done = arrive + -(-(len(result.encode()) + 1) // 8)  # 8 background bytes per micro-turn
    if b.rng.random() < 0.7:
        # Mostly it says it is looking (a talker's "one moment" while the thinker works): the user is
        # not left in silence, and a request it hands off is still a turn it takes.
        hold = b.assistant_says(tick + 1, b.rng.choice(tx.HOLDS))
        if hold is not None:
            done = max(done, hold.start + hold.ticks)
    b.reply_after(done * TICK_SAMPLES, f"{tx.FOUND} {result}")


def scene_quiet(b: _Builder) -> None:
    b.gap(1.0, 3.0)


SCENES = {
    "qa": (scene_qa, 4),
    "pause": (scene_pause, 4),
    "barge_in": (scene_barge_in, 3),
    "user_bc": (scene_user_backchannel, 2),
    "overheard": (scene_overheard, 2),
    "story": (scene_story, 2),
    "typed": (scene_typed, 1),
    "delegate": (scene_delegate, 3),
    "quiet": (scene_quiet, 1),
}


def make_episode(seed: int, ticks: int, speaker: Speaker) -> Episode:
    """One episode of exactly `ticks` micro-turns from `seed` (same seed -> same episode)."""
    b = _Builder(seed, ticks, speaker)
    names = list(SCENES)
    weights = [SCENES[n][1] for n in names]
    b.gap(0.2, 1.0)
    while not b.full():
        name = b.rng.choices(names, weights)[0]
        b.ep.scenes.append(name)
        SCENES[name][0](b)
        b.gap(0.4, 1.5)
    # Noise on the mic: none (a muted or file-fed mic sends exact zeros, and a model that never saw them
    # speaks into them: measured on the first shipped checkpoint), a floor, or louder.
    level = b.rng.choice((0.0, 0.0005, 0.002, 0.005, 0.015))
    noise = np.random.default_rng(seed).standard_normal(len(b.ep.user)).astype(np.float32) * np.float32(level)
    b.ep.user = np.clip(b.ep.user + noise, -1.0, 1.0)
    return b.ep
