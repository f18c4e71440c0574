"""One native-model session's state: what its micro-turns carry from one to the next."""

import codecs
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import Tensor

from models.interaction.floor import SILENT, FloorState
from models.interaction.model import HeadOutputs, TickFeatures
from models.interaction.phrases import PhraseWriter
from models.interaction.replay import TickLog

if TYPE_CHECKING:
    from models.interaction.listener import HeardSession
    from models.interaction.talker import TalkerSession



def _utf8() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


@dataclass
class NativeSession:
    session_id: str
    slot: int  # the KV-pool row this session owns until close
    seed: int  # flow-noise seed derived from session_id: the same id replays the same audio
    user_tail: Tensor  # [CONTEXT] last input samples: left context of the next dMel frames
    self_tail: Tensor  # [CONTEXT] same for the model's own audio
    self_dmel: Tensor  # [20, bins] dMel of what the model said last micro-turn (fed back)
    voc_mag: Tensor  # [3, BINS] Griffin-Lim context magnitudes
    voc_phase: Tensor  # [3, BINS, 2] Griffin-Lim context phases as unit phasors (re, im)
    tick: int = 0  # index of the next micro-turn (= micro-turns stepped so far)
    own_text: list[int] = field(default_factory=list)  # bytes written last micro-turn (fed back)
    typed: bytearray = field(default_factory=bytearray)  # typed text waiting for slots
    background: bytearray = field(default_factory=bytearray)  # background results waiting for slots
    speaking: bool = False  # the model holds the floor (last action was speak)
    user_speaking: bool = False  # the model's VAD logit said the user is speaking
    last_action: int = SILENT
    transcript: str = ""  # the last 500 characters of the user transcript: the delegate query
    last_typed: str = ""  # the last typed text: the delegate query when there is no transcript
    text_dec: codecs.IncrementalDecoder = field(default_factory=_utf8)
    transcript_dec: codecs.IncrementalDecoder = field(default_factory=_utf8)
    closed: bool = False
    writer: PhraseWriter | None = None  # text decoded within the checkpoint's phrase set (None: free)
    talk: "TalkerSession | None" = None  # the Piper talker's queue (None: the flow head speaks)
    log: TickLog | None = None  # its micro-turns, when it may be rebuilt elsewhere (replay.py); None: not kept
    hear: "HeardSession | None" = None  # its recogniser, for a checkpoint with the heard-words channel
    floor: FloorState = field(default_factory=FloorState)  # the turn and overlap checks' state (floor.py)


# Told, for each session of a step, what the model saw and what its heads said: (state, features row,
# head outputs row [1, ...]). Passed to `step` by callers that replay a session whole (teacher forcing
# in tests and training); the server never passes one.
StepObserver = Callable[[NativeSession, TickFeatures, HeadOutputs], None]
