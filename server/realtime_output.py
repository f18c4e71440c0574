"""The Realtime protocol's output mapping: each micro-turn's `TickOutput` as Realtime server events.

Full duplex has no turns, so responses are made up from the output: the first audible (or worded)
micro-turn opens a response, the first silent one without words closes it (`response.done`), and the
model giving up the floor (a barge-in) cancels it with what was said so far. Each response carries one
assistant message item through the API's whole lifecycle (server/lifecycle.py). The user's speech
between the model's `speech_started` and `speech_stopped` becomes a user item once the turn ends (it is
committed before the response that answers it is created), its transcript completing it.

A text-only session (`output_modalities: ["text"]`) has the same responses, made up from the same
output (the model still speaks; its words are the response's text): each carries an `output_text`
part, its words as `response.output_text.delta`, and no audio leaves the server.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from models.base import TickOutput
from server import lifecycle as lc
from server import protocol as p
from server import response_config
from server.connection import Connection
from server.sessions import Pace
from streaming.types import SAMPLE_RATE, TICK_SECONDS

TICK_MS = int(TICK_SECONDS * 1000)
KEPT_TIMINGS = 16  # recent assistant items whose words' times are kept, for conversation.item.truncate
_TURN_EVENTS = ("speech_started", "speech_stopped")
# A model that stops talking when the user speaks over it (the cascade pauses first, and drops the rest
# of its answer only once the overlap proves a barge-in, up to a second later) has not finished: while
# the client's microphone carries sound, a silent answer is held open this many micro-turns, so the
# barge-in cancels it, or the answer goes on in the same response.
HOLD_TICKS = 6
VOICE_TICKS = 3  # sound within this many micro-turns of a silent one counts as the user speaking over it


class RealtimeOutput:
    """One connection's response and transcript state; events leave through the connection's `emit`."""

    def __init__(self, conn: Connection, emit: Callable[[dict[str, Any]], None], extensions: bool = True) -> None:
        self.conn = conn
        self.emit = emit  # as is: the connection's `emit` would make a whole response of a bare tool call
        self.extensions = extensions  # live transcript deltas with ticks, duplex.tick, duplex.event
        self.response_id: str | None = None  # the assistant utterance in progress
        self.last_response_id: str | None = None
        self._item_id: str | None = None
        self._modality = "audio"  # the open response's: fixed when it opens, whatever session.update says later
        self._metadata: dict[str, str] | None = None  # the open response's, from response.create
        self._said: list[tuple[int, str]] = []  # (ms of the item's audio before the words, words)
        self._audio_ms = 0  # audio of the open item so far
        self.timings: OrderedDict[str, list[tuple[int, str]]] = OrderedDict()  # item id -> its words' times
        self._user_item: str | None = None  # the user's turn in progress
        self._user_start_ms = 0
        self._user_text: list[str] = []
        self._late: tuple[str, float] | None = None  # (item, seconds): committed without words, transcript pending
        self._stopped_early = False  # the turn was committed when a response began; its speech_stopped is spent
        self._voice_tick = -VOICE_TICKS - 1  # the last micro-turn whose input had sound
        self._held = 0  # silent micro-turns the open response was held for
        self._overlap = False  # the user's open turn began while the open response was being said
        self._typed: deque[str] = deque(maxlen=8)  # typed messages the model may echo as the user's words
        self._deferred: list[dict[str, Any]] = []  # events of another response, held until this one is done
        self._suppress_before = 0  # outputs of ticks before this were cancelled by response.cancel

    def silence_before(self, tick: int) -> None:
        """Outputs of micro-turns before `tick` (already in flight) are not heard (a cancel, a clear)."""
        self._suppress_before = tick

    def deliver(self, out: TickOutput, tick: int) -> None:
        conn = self.conn
        if conn.audio_out is not None and any(ev.type == "yielded" for ev in out.events):
            conn.audio_out.clear()  # the model gave up the floor (barge-in): queued speech must not play on
        s = conn.session
        media = s.settings.pace is Pace.MEDIA
        audio = out.audio
        if tick < self._suppress_before:
            audio = np.zeros_like(audio)  # cancelled: this tick was already in flight
        if out.user_text:
            self._user_transcript(out.user_text, tick)
        for ev in out.events:  # the user's turn first: the answer is created after the turn's commit
            if ev.type in _TURN_EVENTS:
                self._turn_event(ev.type, tick)
        speaking = bool(np.any(audio))
        worded = bool(out.text) and tick >= self._suppress_before
        if (speaking or worded) and self.response_id is None:
            # A backchannel ("mm-hm") over the user's turn answers nothing: the turn stays open.
            self._start_response(tick, commit=not any(ev.type == "backchannel" for ev in out.events))
        text_only = s.settings.output_modality == "text" if self.response_id is None else self._modality == "text"
        if worded:
            self._said.append((self._audio_ms, out.text))
            delta = {"type": "response.output_text.delta" if text_only else "response.output_audio_transcript.delta",
                     "event_id": p.new_id("event"), "response_id": self.response_id, "item_id": self._item_id,
                     "output_index": 0, "content_index": 0, "delta": out.text, "tick": tick}
        if text_only:
            if self.response_id is not None:
                self._audio_ms += TICK_MS  # the words' times, as if heard (conversation.item.truncate)
        elif speaking or media:
            self.send_audio(audio, tick)
        if worded:
            self.emit(delta)
        for ev in out.events:
            if ev.type not in _TURN_EVENTS:
                self._model_event(ev.type, ev.data, tick)
        if speaking or worded:
            self._held = 0
        elif self.response_id is not None and not self._holding(tick):
            self.finish_response("completed")
        if s.settings.tick_stats:
            self.emit({"type": "duplex.tick", "event_id": p.new_id("event"), "tick": tick,
                       "buffered_ms": int(s.buffered_samples / SAMPLE_RATE * 1000),
                       "dropped_samples": s.dropped_samples, "late_ms": round(s.last_lateness * 1000, 1),
                       "heard_samples": s.heard_through})

    def heard_sound(self) -> None:
        """The client's microphone carried sound in the micro-turn being filled now."""
        self._voice_tick = self.conn.session.tick

    def _holding(self, tick: int) -> bool:
        """Whether a silent open response waits: the user is speaking over it (the model paused)."""
        if self._user_item is not None and self._overlap:
            return True  # the user began speaking over it: the turn's end, or the model's yield, decides
        if tick - self._voice_tick <= VOICE_TICKS and self._held < HOLD_TICKS:
            self._held += 1
            return True
        return False

    def send_audio(self, audio: np.ndarray, tick: int) -> None:
        """One micro-turn of output audio (24 kHz float32): to the transport's audio path, or as an event."""
        if self.response_id is not None:
            self._audio_ms += TICK_MS
        if self.conn.audio_out is not None:
            self.conn.audio_out.push(audio)
            return
        if self.response_id is None and not self.extensions:
            return  # media pace's silence between responses belongs to no response: duplex's clients only
        self.emit({"type": "response.output_audio.delta", "event_id": p.new_id("event"),
                   "response_id": self.response_id, "item_id": self._item_id, "output_index": 0,
                   "content_index": 0, "delta": self.conn.encode_audio(audio), "tick": tick})

    # -- responses ------------------------------------------------------------------------------

    def _start_response(self, tick: int, commit: bool = True) -> None:
        if commit and self._user_item is not None:  # the model answers over an open turn: the turn ends here
            self._commit_user(tick, early=True)
        self.response_id, self._item_id = p.new_id("resp"), p.new_id("item")
        self._said, self._audio_ms, self._held, self._overlap = [], 0, 0, False
        s = self.conn.session
        asked = response_config.take_output(s)  # what a response.create asked of this response, if anything
        self._modality = modality = asked.modality_for(s.settings)
        self._metadata = asked.metadata
        previous = s.items.last_id()
        for event in (lc.created(self.response_id, modality, asked.metadata)
                      + lc.message_opened(self.response_id, self._item_id, previous, modality)):
            self.emit(event)

    def finish_response(self, status: str, reason: str | None = None) -> None:
        """Close the open response (completed, or cancelled with the words said so far)."""
        rid, iid = self.response_id, self._item_id
        if rid is None or iid is None:
            return
        self.response_id = self._item_id = None
        self.last_response_id = rid
        self.timings[iid] = self._said
        while len(self.timings) > KEPT_TIMINGS:
            self.timings.popitem(last=False)
        text = "".join(words for _, words in self._said)
        for event in lc.message_closed(rid, iid, text, status, self._modality, reason=reason, metadata=self._metadata):
            self.emit(event)
        deferred, self._deferred = self._deferred, []
        for event in deferred:
            self.emit(event)

    def after_response(self, events: list[dict[str, Any]]) -> None:
        """Another response's events (a tool call): now, or once the open response is done."""
        if self.response_id is not None:
            self._deferred.extend(events)
            return
        for event in events:
            self.emit(event)

    def truncated_text(self, item_id: str, audio_end_ms: int) -> str | None:
        """The item's words said before `audio_end_ms` of its audio; None when their times are not kept."""
        said = self._said if item_id == self._item_id else self.timings.get(item_id)
        if said is None:
            return None
        kept = [(at, words) for at, words in said if at < audio_end_ms]
        if item_id != self._item_id:
            self.timings[item_id] = kept
        return "".join(words for _, words in kept)

    @property
    def item_id(self) -> str | None:
        return self._item_id

    # -- the user's turns -----------------------------------------------------------------------

    def typed(self, text: str) -> None:
        """A typed message, already its own item: the model reporting it as heard words is not a spoken turn."""
        self._typed.append(text.strip())

    def _user_transcript(self, text: str, tick: int) -> None:
        if text.strip() in self._typed:
            self._typed.remove(text.strip())
            return
        late, self._late = self._late, None
        if late is not None and self._user_item is None:
            # A final transcript made after the end of turn (cascade + Whisper) completes the item the
            # turn's commit announced, as Realtime's asynchronous transcription does.
            for event in lc.user_transcribed(late[0], text, late[1], []):
                self.emit(event)
            return
        if self._user_item is None:  # words without speech_started: the turn began unannounced
            self._open_user(tick)
        self._user_text.append(text)
        if self.extensions:  # duplex's own clients see the words as they come
            self.emit({"type": "conversation.item.input_audio_transcription.delta", "event_id": p.new_id("event"),
                       "item_id": self._user_item, "content_index": 0, "delta": text, "tick": tick})

    def _open_user(self, tick: int) -> None:
        self._settle_late()
        self._user_item, self._user_start_ms, self._user_text = p.new_id("item"), tick * TICK_MS, []
        self._stopped_early = False

    def _settle_late(self) -> None:
        """A committed turn whose transcript never came is done without one when the next turn starts."""
        late, self._late = self._late, None
        if late is not None:
            for event in lc.user_transcribed(late[0], "", late[1], []):
                self.emit(event)

    def _turn_event(self, etype: str, tick: int) -> None:
        if etype == "speech_started":
            if self._user_item is None:
                self._open_user(tick)
                self._overlap = self.response_id is not None
            self.emit({"type": "input_audio_buffer.speech_started", "event_id": p.new_id("event"),
                       "audio_start_ms": tick * TICK_MS, "item_id": self._user_item, "tick": tick})
        elif self._user_item is not None:
            self._commit_user(tick, early=False)
        # else: a speech_stopped for a turn already committed when the answer began

    def _commit_user(self, tick: int, early: bool) -> None:
        item = self._user_item
        assert item is not None
        end_ms = tick * TICK_MS + TICK_MS
        self.emit({"type": "input_audio_buffer.speech_stopped", "event_id": p.new_id("event"),
                   "audio_end_ms": end_ms, "item_id": item, "tick": tick})
        previous = self.conn.session.items.last_id()
        for event in lc.user_committed(item, previous):
            self.emit(event)
        seconds = (end_ms - self._user_start_ms) / 1000
        if self._user_text:
            held = [] if self.extensions else self._user_text
            for event in lc.user_transcribed(item, " ".join(self._user_text), seconds, held):
                self.emit(event)
        else:
            self._late = (item, seconds)  # its transcript may follow
        self._user_item, self._user_text, self._stopped_early, self._overlap = None, [], early, False

    def commit_now(self) -> str | None:
        """`input_audio_buffer.commit`: the open turn, if any, becomes an item now; its id."""
        item = self._user_item
        if item is not None:
            self._commit_user(self.conn.session.tick, early=True)
        return item

    # -- everything else ------------------------------------------------------------------------

    def _model_event(self, etype: str, data: dict[str, Any], tick: int) -> None:
        if etype == "yielded":
            self.finish_response("cancelled", "turn_detected")  # the barge-in ends the answer as heard
        if etype == "error":
            self.conn.runtime.metrics.client_errors.labels("model_error").inc()
            self.emit(p.error_event("model_error", str(data.get("message", "model error")), kind="server_error"))
        else:
            self.emit({"type": "duplex.event", "event_id": p.new_id("event"), "event": etype, "data": data,
                       "tick": tick})
