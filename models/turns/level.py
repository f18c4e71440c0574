"""Speech level in dBFS, for telling the user's own voice from a bystander's: quieter speech around them
(a television, someone across the room) is not the user talking."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streaming.types import Audio

FRAME = 320  # 20 ms at 16 kHz
# Frames this far below the loudest frame of their micro-turn are gaps between words, not speech: left
# out, so a pause inside a tick does not pull the level down.
_ACTIVE_DB = 25.0
_FLOOR = 1e-12
# Mostly-speech micro-turns a turn needs before its level says whose voice it is (`bystander_turn`).
LEVEL_TICKS = 2
_SILENT_POWER = 10 ** (-60.0 / 10)  # a chunk whose loudest frame is under -60 dBFS is silence, not speech
# Speech this many dB quieter than the user's own voice is a bystander's (a television, someone across the
# room): both voices read it (the cascade's `background_db` defaults to it; the native turn and overlap checks).
BYSTANDER_DB = 5.0


def _frame_power(x: Audio) -> npt.NDArray[np.float64]:
    n = len(x) // FRAME * FRAME
    return np.mean(np.square(x[:n].astype(np.float64)).reshape(-1, FRAME), axis=1)


@dataclass
class SpeechLevel:
    """The mean power of the speech frames heard so far (an active speech level), in dBFS.

    Why not a statistic of per-micro-turn peaks: a talker's peaks swing +-8 dB from word to word
    and an utterance's first words are its loudest, so two ticks' median put television speech
    mixed 10.5 dB under the user only 2 dB under them (FD-bench v1.5 background_speech, seed 0).
    The power mean over every active frame so far converges on the talker's level as they go on.
    """

    power: float = 0.0  # summed power of the active frames
    frames: int = 0
    ticks: int = 0  # micro-turns added

    def add(self, x: Audio, skip_silent: bool = False) -> None:
        """Add one micro-turn of speech; with `skip_silent`, not a chunk that is silence (the gaps between
        utterances of a stream that is not only speech)."""
        power = _frame_power(x)
        least = _SILENT_POWER if skip_silent else _FLOOR
        if not len(power) or power.max() <= least:
            return
        active = power[power >= power.max() * 10 ** (-_ACTIVE_DB / 10)]
        self.power += float(active.sum())
        self.frames += len(active)
        self.ticks += 1

    @property
    def db(self) -> float | None:
        if not self.frames:
            return None
        return float(10.0 * np.log10(max(self.power / self.frames, _FLOOR)))


def speech_db(x: Audio, tick: int = 3200) -> float | None:
    """The active speech level of a whole 16 kHz clip, measured tick by tick as the cascade does."""
    level = SpeechLevel()
    for i in range(0, len(x), tick):
        level.add(x[i : i + tick], skip_silent=True)
    return level.db


@dataclass
class UserLevel:
    """The user's own speech level, learnt from the turns of theirs that were answered."""

    db: float | None = None  # dBFS; None until the first answered turn with a level

    def learn(self, level: float) -> None:
        self.db = level if self.db is None else 0.7 * self.db + 0.3 * level

    def quieter(self, level: float | None, margin_db: float) -> bool:
        """Speech at `level` is `margin_db` (0: never) quieter than the user's own: a bystander's."""
        if level is None or self.db is None or margin_db <= 0:
            return False
        return level < self.db - margin_db


def bystander_turn(turn_open: bool, level: SpeechLevel, quieter: bool) -> bool | None:
    """The open turn (an overlap, or any turn) is a bystander's talk: `quieter`, its speech level so far
    against the user's (`UserLevel.quieter`), once it has `LEVEL_TICKS` mostly-speech ticks; None
    before that: one tick is no level."""
    if not turn_open:
        return False
    if level.ticks < LEVEL_TICKS:
        return None
    return quieter
