"""Has the user finished? The words' verdict, asked when the user stops, as evidence for an onset.

The shipped `native:tiny` tells a finished turn from a mid-sentence pause by its shape more than by
its words: after one short sentence alone ("Why is the sky blue during the day?") its p(speak) and
p(delegate) peak at 0.25-0.35 each and silence wins, as it does in a pause after "... because"; put
"Okay, here is something I never understood." before the same question and p(speak) reaches 0.6-0.9
(measured on 10 held-out questions in three espeak voices). Its heard-words channel barely moves it:
the question's true last word fed in place of the recogniser's changed p(speak) by at most 0.01
(the same probe). Training the shape away made it take every pause (phase 11, README): the 2-core
budget buys a model that knows *that* someone may be done, not yet *whether*.

What knows whether is the cascade's end-of-turn evidence: Whisper tiny.en's punctuated transcript of
the user's last seconds and, where it loads, the text model's P(finished) of those words
(models/speech/text_turn.py), combined by `models.turns.words.verdict` into finished, unfinished or
unclear. It is asked once per user utterance, when the model's own voice head says the user stopped,
on a worker thread of its own, and used a fixed `DUE_TICKS` later, as the hand-off's query is (query.py):
a media-pace engine and a replay wait for it through `pending_work`; in real time, one later than a short
wait of the step holds the onset back until it is in (`LATE_TICKS` at most: onset.PENDING), and the
micro-turn it comes in decides with the keenest onset the model proposed meanwhile, so a busy machine
decides as media pace does, later. The model proposes every onset but the longest wait's (below); the
verdict disposes (onset.decide):

  finished    where the model would stay silent, it takes the floor when p(speak) + p(delegate)
              outscores each other action: the split between speaking and handing off no longer leaves
              the floor to silence (how it takes it: below);
  unfinished  it does not start speaking or hand off (a backchannel is still its to make); words that
              end on Whisper's "?" are never unfinished (unclear instead): the text model's doubt
              about a question is mostly a word Whisper misheard;
  unclear     its own decision, as without the check.

Where it takes the floor, the words also settle how (onset.py, `Words.lookup`): it hands off to the
background reasoner where they ask in so many words for something looked up, found, checked or searched
(`asks_to_look_up`: training's definition of a look-up, train/_texts.py), and speaks otherwise. Its own
split between the two was learnt from training's sentences and does not carry to others (onset.py).

A verdict holds until the user speaks again or the model takes the turn. Where neither has happened
`HOLD_TICKS` after one on words in the user's voice (more than a backchannel, not a bystander's level),
the floor is taken (onset.WAITED) whatever p(speak): the cascade's longest wait, after which a listener
answers even a turn that sounded unfinished (`after_the_wait`). Whisper mishears voices it never met as
unfinished ("How do I say no to a friend politely?" in espeak en-us+f4 at 1.1x, `bench.native.handoff`: 6
of 48 questions were left unanswered without this), the model lets some finished requests pass, and a
user who gave up on a clause is not left in silence. `--native-turn-check off` serves the model alone.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from models.interaction.onset import BYSTANDER, WAITED, Words
from models.interaction.query import shared_whisper, speech_clip, wants_whisper
from models.speech.asr import WhisperTranscriber
from models.speech.ears import Ears
from models.turns.level import BYSTANDER_DB, UserLevel, speech_db
from models.turns.words import FINISHED, UNCLEAR, UNFINISHED, only_backchannel, verdict
from models.turns.work import Job
from streaming.types import SAMPLE_RATE

if TYPE_CHECKING:
    from models.speech.text_turn import TextTurn

log = logging.getLogger(__name__)

__all__ = ["DUE_TICKS", "FINISHED", "HOLD_TICKS", "LATE_TICKS", "UNCLEAR", "UNFINISHED", "WAIT_S", "PendingCheck",
           "TurnChecker", "Words", "after_the_wait", "asks_to_look_up", "whose"]

# One micro-turn, as the cascade's Whisper verdict (`whisper_ticks`): the model's voice head says the
# user stopped one micro-turn after the speech ends, and training's replies start 2-3 after it, so the
# verdict is there for the first of them. Whisper on a few seconds takes ~0.15 s of a core; on a
# loaded machine it is late, and the onset waits for it (`LATE_TICKS`).
DUE_TICKS = 1
# Checked here (2-core machine, idle): Silero 15 ms, Whisper 81 ms, the text model 21 ms for a 2.3 s
# question. Asked mid-step and due the next step, it often lands just after that step starts in real
# time (3 of 10 short questions answered in real time without a wait, 10 of 10 in media pace): the step
# waits for the checks due in it up to `WAIT_S`, shared by its sessions as the listener's partials are
# (listener.py), well inside the micro-turn a step may take.
WAIT_S = 0.1
# A verdict later than that is waited for, the model neither speaking nor handing off meanwhile (onset.PENDING),
# for up to this many micro-turns past its due one; then it decides alone (counted as late work). Streamed in
# real time on this machine (FD-bench v1.5 set 9595, one session: the client, the talker and the recogniser
# beside it) a check took 0.21-0.93 s from being asked (median 0.40 s, 33 checks; 0.21 s idle: Whisper's
# encoder 92 ms and decoder 88 ms, Silero 22 ms, for a 3.2 s question), late in 14 or more of them. Deciding
# without it, the model answered questions it should have handed off and television lines (no level of the
# user's learnt to tell them by: `whose`). A verdict used late costs the onset the micro-turns it waited;
# media pace and a replay wait for it at its due micro-turn, so with it real time decides as they do, later.
LATE_TICKS = 4
# 3 s: the cascade's longest wait after a pause whose words trail off (eagerness medium); then the turn is taken
HOLD_TICKS = 15
CLIP_S = 8.0  # what is judged: the user's last 8 s (Smart Turn's window; Whisper's cost grows with it)

# A request for a look-up: one of its verbs where a clause starts (after words of address: "please",
# "okay", "hey", a name-less "so"), bare ("Look up ...", "Please find out ...") or asked of the listener
# ("can you ...", "would you mind ...", "I need you to ..."). The verb alone is not one: "How do I find
# time to read?" and "Should I check the oil?" ask for the model's own reply.
# At most four, and never given back (possessive, Python 3.11): a client's typed "ok, ok, ok, ..." costs linear
# time, not a retry of every run of leads from every comma (measured: 11 ms for 1000 characters before, 0.2 after).
_LEAD = r"(?:(?:please|okay|ok|so|hey|now|and|also|oh|well|just|quickly|then|right),?\s+){0,4}+"
_ASK = (r"(?:(?:can|could|would|will)\s+you|would\s+you\s+mind|do\s+you\s+mind|i\s+(?:need|want|would\s+like)\s+"
        r"you\s+to|i'd\s+like\s+you\s+to|you\s+(?:could|should)|go\s+and)\s+" + _LEAD)
_VERB = (r"(?:look(?:ing)?\s+(?:(?:it|that|this|them)\s+)?up|look\s+(?:for|into)|find(?:ing)?|search(?:ing)?|"
         r"check(?:ing)?|google|research)\b")
_LOOKUP = re.compile(r"(?:^|[.!?,;:]\s*)" + _LEAD + r"(?:" + _ASK + r")?" + _VERB, re.IGNORECASE)


LOOKUP_CHARS = 1000  # a typed message is read for a look-up this far: a request comes first, and the cost
# on the inference thread stays bounded whatever a client types (0.2 ms for 1000 characters of "ok, ok, ...",
# the worst input measured)


def asks_to_look_up(words: str) -> bool:
    """The words ask the listener, in so many words, to look something up, find, check or search it."""
    return _LOOKUP.search(words.strip()[:LOOKUP_CHARS]) is not None


def whose(verdict: Words, user: UserLevel) -> Words:
    """The verdict, or where its words were said `BYSTANDER_DB` quieter than `user` (the level of the user's
    turns the model answered) a bystander's (onset.BYSTANDER): a television line or someone across the room
    is no turn to take, however finished its words. The cascade's rule (`background_db`): it never answers
    one. Without it the model answered 4 of FD-bench's 10 v1.5 background lines of set 9595 once they ended."""
    if verdict.turn == WAITED or not user.quieter(verdict.level, BYSTANDER_DB):
        return verdict
    return Words(BYSTANDER, None, verdict.text, verdict.level)


def after_the_wait(held: Words, user: UserLevel) -> Words | None:
    """A verdict held `HOLD_TICKS` with the user silent and the floor not taken: the turn taken (onset.WAITED)
    where words were heard, more than a listener's "mm-hm" or "okay", and not said `BYSTANDER_DB` quieter
    than `user` (the level of the user's turns the model answered: a television line after the model
    stopped for it is no turn to answer); else nothing. As the cascade, which answers every turn of the
    user's within its longest wait: a finished turn the model let pass too ("Please explain how a car
    engine works.", whose shape the model is least sure of, README), and so a remark to someone else at the
    user's own level gets a late reply. Once: a WAITED verdict itself ends in nothing."""
    held = whose(held, user)  # the one level gate (a verdict set without it, or before the level was known)
    if held.turn in (WAITED, BYSTANDER) or not held.text or only_backchannel(held.text):
        return None
    return Words(WAITED, held.lookup, held.text)


@dataclass
class PendingCheck(Job[Words]):
    """A verdict asked, due at micro-turn `due`."""

    name: str = "turn check"

    def verdict(self, wait: float = 0.0) -> Words:
        """The verdict where it is ready within `wait` seconds; unclear (no words) where it is late or failed."""
        return self.settle(wait) or Words(UNCLEAR)


def _text_turn() -> TextTurn | None:
    """The text model, loaded on the calling thread: llama.cpp points the process's stdout and stderr at
    /dev/null while it loads, and on a worker thread that swallowed the start-up log lines the server
    wrote meanwhile (measured: the onset and hand-off lines were missing from a server's log)."""
    from models.speech.text_turn import TextTurn, TextTurnError

    try:
        return TextTurn(contexts=1)
    except TextTurnError as e:
        log.warning("turn check without the text model (%s): Whisper's punctuation and last word judge alone", e)
        return None


class TurnChecker:
    """Whisper (and the text model) on one worker thread shared by a model's sessions. The text model
    loads here (0.3 s measured, 2 s from a cold disk cache), Whisper on that thread: a server starts
    without waiting for it, and a check asked before it is ready is late (unclear), never a held step."""

    def __init__(self, whisper: Callable[[], WhisperTranscriber] = shared_whisper) -> None:
        text_turn = _text_turn()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="native-turn-check")
        self._ears = self._pool.submit(lambda: Ears(whisper(), text_turn))

    @staticmethod
    def for_mode(mode: str) -> TurnChecker | None:
        """`--native-turn-check`: words (an error if Whisper is not installed), off (None), auto (words
        where Whisper is installed)."""
        return TurnChecker() if wants_whisper(mode, "--native-turn-check", "words", "off") else None

    def submit(self, audio: np.ndarray) -> Future[Words]:
        """Judge the user's turn ending with `audio` (int16 at `SAMPLE_RATE`, as `UserAudio` keeps it)."""
        return self._pool.submit(self._judge, audio[-int(CLIP_S * SAMPLE_RATE) :])

    def _judge(self, audio: np.ndarray) -> Words:
        speech = speech_clip(audio)
        if speech is None:
            return Words(UNCLEAR)  # no speech found (noise, a hum the voice head took for words)
        heard = self._ears.result().hear(speech, judge=True)
        raw = heard.transcript.raw.strip()
        said = verdict(raw, heard.p_text)
        # A question mark is Whisper hearing a question end; the text model's doubt then is mostly a word
        # Whisper got wrong ("Why do cats purr when they are happy?" as "... cats that when ...", P(finished)
        # 0.003 in an espeak voice): not enough to hold back an onset the model chose. Unclear, not unfinished.
        said = UNCLEAR if said == UNFINISHED and raw.endswith("?") else said
        return Words(said, asks_to_look_up(raw) if raw else None, raw, speech_db(speech))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
