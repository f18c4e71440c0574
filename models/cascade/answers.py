"""Speaking answers: what the assistant queues to say (acknowledgments, backchannels, the background
reasoner's answer sentence by sentence as it streams in), what it stops saying, and what it said.

The answer comes back as `BackgroundChunk`s of the request the cascade delegated; each request's text
is cut into sentences (text.SentenceSplitter) and each sentence is synthesised as soon as it is
complete (speaker.py). A new question, a barge-in or a cancel mutes every request seen so far: chunks
of those still arriving are dropped, and so are chunks of epochs older than the newest seen. A new
question also drops the answers to every question asked before it, even those not seen yet: each
delegate event numbers its question (`ask`) and the reasoner's chunks carry that number back. (The
worker drops them too once it has the new request, but chunks of the older one may already be in the
micro-turns taken before that, or arrive while the new question's transcript is still due.) What was
spoken is remembered for `_ECHO_MEMORY_MS`: overlapped words that are all among them are our own echo.

An answer to a question about what is seen is held until it is whole and said only if it keeps to the
perception facts; else the facts are said (grounding.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from models.base import BackgroundChunk, Event
from models.cascade.grounding import Facts, check, fallback, kind_of
from models.cascade.options import CascadeOptions
from models.cascade.text import SentenceSplitter, words_of
from models.speech.speaker import Speaker, TickSpeech
from models.turns.work import StepClock

_ECHO_MEMORY_MS = 10_000  # how long the assistant's words count as possible echo


@dataclass
class AnswerState:
    """One session's speaking: the phrase queue and what feeds it."""

    speaker: Speaker  # the assistant's queued phrases, cut into micro-turns of audio
    said: deque[tuple[float, list[str]]] = field(default_factory=deque)  # (media ms, words) spoken lately
    seen: set[str] = field(default_factory=set)  # reasoner request ids seen so far
    muted: set[str] = field(default_factory=set)  # request ids whose further chunks are dropped
    max_epoch: int = 0  # newest reasoner epoch seen; older chunks are stale
    splitters: dict[str, SentenceSplitter] = field(default_factory=dict)  # per streaming request
    acks: int = 0  # acknowledgments said (rotates the phrase)
    backchannels: int = 0  # backchannels said (rotates the phrase)
    ground_next: tuple[str, Facts] | None = None  # the question just delegated is about what is seen
    grounded: dict[str, tuple[str, Facts, list[str]]] = field(default_factory=dict)  # request id -> its text so far
    asked: int = 0  # questions delegated so far (the last one's `ask` number)
    first_ask: int = 0  # answers to questions numbered below this are dropped: a newer one took the floor

    def number_question(self) -> int:
        """The `ask` number of a question delegated now."""
        self.asked += 1
        return self.asked

    def ground(self, question: str, facts: Facts) -> None:
        """The next request's answer is checked against `facts` before it is said, if `question` is
        about what is seen."""
        self.ground_next = (question, facts) if kind_of(question) is not None else None

    def take_floor(self, o: CascadeOptions) -> None:
        """A new question: it supersedes whatever answer is still pending or held back; acknowledged."""
        self.speaker.drop()
        self.mute()
        self.first_ask = self.asked + 1  # the answers to earlier questions, even those not begun, are not said
        self.ground_next = None
        if o.ack and o.ack_phrases:
            self.speaker.say(o.ack_phrases[self.acks % len(o.ack_phrases)], "ack")
            self.acks += 1

    def stop(self, reason: str, ev: list[Event]) -> None:
        """Stop talking now and drop the rest of the answer (a barge-in, or the client's cancel)."""
        dropped = self.speaker.drop()
        self.mute()
        if dropped or reason == "cancel":
            ev.append(Event("yielded", {"reason": reason, "dropped": " ".join(p.text for p in dropped)}))

    def mute(self) -> None:
        self.muted |= self.seen
        self.splitters.clear()
        self.grounded.clear()  # answers held for their check are never said either

    def add_chunk(self, c: BackgroundChunk, error_phrase: str, ev: list[Event]) -> None:
        """Queue the sentences a reasoner chunk completes (the error phrase after a failed request)."""
        if c.epoch < self.max_epoch or c.request_id in self.muted or (c.ask is not None and c.ask < self.first_ask):
            return  # stale: superseded by a newer request or question, or interrupted
        self.max_epoch = c.epoch
        if c.request_id not in self.seen and self.ground_next is not None:
            self.grounded[c.request_id], self.ground_next = (*self.ground_next, []), None
        self.seen.add(c.request_id)
        if c.request_id in self.grounded:
            self._grounded(c, ev)
            return
        splitter = self.splitters.setdefault(c.request_id, SentenceSplitter())
        sentences = splitter.push(c.text)
        if c.done or c.error:
            sentences += splitter.flush()
            del self.splitters[c.request_id]
        for sentence in sentences:
            self.speaker.say(sentence, "answer", c.request_id)
        if c.error:
            self.speaker.say(error_phrase, "error", c.request_id)
            ev.append(Event("background_error", {"request_id": c.request_id, "error": c.error}))

    def _grounded(self, c: BackgroundChunk, ev: list[Event]) -> None:
        """A chunk of an answer about what is seen: kept until the answer is whole, then it is said if
        it keeps to the facts, else the facts are (a failed request says the facts too)."""
        question, facts, parts = self.grounded[c.request_id]
        parts.append(c.text)
        if not (c.done or c.error):
            return
        del self.grounded[c.request_id]
        answer = "".join(parts).strip()
        verdict = check(question, answer, facts) if not c.error else None
        said = answer if verdict is not None and verdict.ok else fallback(question, facts)
        splitter = SentenceSplitter()
        for sentence in [*splitter.push(said), *splitter.flush()]:
            self.speaker.say(sentence, "answer", c.request_id)
        ev.append(Event("grounding", {"request_id": c.request_id, "kept": said == answer, "answer": answer,
                                      "said": said, "why": verdict.why if verdict is not None else "error"}))

    def backchannel(self, phrases: tuple[str, ...], ev: list[Event]) -> None:
        phrase = phrases[self.backchannels % len(phrases)]
        self.backchannels += 1
        self.speaker.say(phrase, "backchannel")
        ev.append(Event("backchannel", {"text": phrase}))

    def speak(self, hold: bool, now_ms: float, clock: StepClock) -> TickSpeech:
        """This micro-turn's speech (`hold`: only backchannels may play); remembers what started."""
        with clock.timed("synthesis", wait=True):
            speech = self.speaker.play(hold=hold, grace=clock.left())
        for p in speech.started:
            self.said.append((now_ms, words_of(p.text)))
        while self.said and self.said[0][0] < now_ms - _ECHO_MEMORY_MS:
            self.said.popleft()
        return speech

    def said_lately(self, words: str) -> bool:
        """`words` are all words the assistant itself said recently (they are its own echo)."""
        ws = words.split()
        if not ws:
            return False
        recent = {w for _, said in self.said for w in said}
        return all(w in recent for w in ws)
