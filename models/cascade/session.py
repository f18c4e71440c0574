"""One cascade session's state, kept between micro-turns (models/cascade/model.py steps it).

`CascadeModel.open` creates it and `close` frees it; each part is the state of the module named beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.cascade.aec import EchoCanceller
from models.cascade.answers import AnswerState
from models.cascade.hearing import HearingState
from models.cascade.overlaps import OverlapState
from models.cascade.pauses import PauseState
from models.cascade.policy import TurnState
from models.cascade.sight import SightState
from models.speech.vad import VADStream
from models.turns.level import UserLevel
from streaming.resample import StreamResampler


@dataclass
class CascadeState:
    """Everything one session keeps between micro-turns. Created by `open`, freed by `close`."""

    session_id: str
    mic: StreamResampler  # user audio 24 kHz -> 16 kHz
    ref: StreamResampler  # assistant audio 24 kHz -> 16 kHz, the echo reference
    aec: EchoCanceller  # subtracts the assistant's own voice from the user's input
    vad: VADStream  # Silero recurrent state and leftover samples
    hearing: HearingState  # the open turn's audio and transcripts, the finished turn's final one
    answers: AnswerState  # what the assistant says: its phrase queue and the answers feeding it
    turn: TurnState = field(default_factory=TurnState)  # the policy's counters
    pause: PauseState = field(default_factory=PauseState)  # the current pause's end-of-turn cues
    overlap: OverlapState = field(default_factory=OverlapState)  # the open overlap's cues
    user: UserLevel = field(default_factory=UserLevel)  # the user's own speech level (tells bystanders apart)
    sight: SightState = field(default_factory=SightState)  # the camera: visual state, held questions
    tick: int = 0  # index of the micro-turn stepped last (the clock of the off-thread jobs' `due`)
