"""The verbs a protocol handler calls with a client's input, whatever its protocol and transport.

A connection (server/connection.py and its protocols) turns each client event into one of these;
nothing outside the runtime touches the engine or a session's inbox. `Runtime` has them all; the
session's life (attach, detach, close) is in server/runtime.py.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt

from server import protocol as p
from server.engine import Engine
from server.metrics import Metrics
from server.sessions import Pace, Session, SessionSettings
from streaming.types import Audio

OVERRUN_ERROR_EVERY = 1.0  # seconds between repeated input_overrun errors to one session


class Verbs:
    engine: Engine
    metrics: Metrics

    async def push_audio(self, session: Session, audio: Audio) -> None:
        """Client audio, mono float32 at 24 kHz: media pace waits while the session's backlog is full
        (back-pressure), real time drops the oldest (`push_live_audio`)."""
        if session.settings.pace is Pace.MEDIA:
            await self.engine.push_audio_media(session, audio)
        else:
            self.push_live_audio(session, audio)

    def push_live_audio(self, session: Session, audio: Audio) -> None:
        """Real-time audio (RTP comes only this way): what overruns the backlog drops its oldest input,
        and the client is told (an `input_overrun` error, at most one a second)."""
        if self.engine.push_audio(session, audio) and session.inbox.overrun_due(time.monotonic(), OVERRUN_ERROR_EVERY):
            self.metrics.client_errors.labels("input_overrun").inc()
            session.emit(p.error_event("input_overrun", "audio is arriving faster than real time; the oldest input "
                                       f"was dropped ({session.inbox.dropped} samples so far). Send at real-time "
                                       "pace or use session.pace 'media'"))

    def push_text(self, session: Session, text: str) -> None:
        """Typed user text for the next micro-turn; raises TextFull past the inbox's bound."""
        session.inbox.add_text(text)
        session.log.add(session.tick * self.engine.period, "user", text, kind="typed")
        self.engine.nudge(session)

    def push_video(self, session: Session, frame: npt.NDArray[np.uint8]) -> None:
        """The newest camera frame; the next micro-turn takes it (an older one not yet taken is replaced)."""
        session.inbox.video = frame

    def respond(self, session: Session) -> None:
        """The client asked for a response: only a hint (the model decides every micro-turn), but a media
        session may be steppable now."""
        self.engine.nudge(session)

    def cancel(self, session: Session) -> None:
        """The client asked to stop the current utterance: the next micro-turn carries the request."""
        session.inbox.request_cancel()
        self.engine.nudge(session)

    def clear_input(self, session: Session) -> None:
        """Drop the audio waiting for the coming micro-turns (input_audio_buffer.clear)."""
        session.inbox.clear()

    def settings_changed(self, session: Session, new: SessionSettings) -> None:
        """The client changed its settings (session.update); a new pace moves it to the other engine loop."""
        pace_changed = new.pace is not session.settings.pace
        session.settings = new
        if pace_changed:
            self.engine.add(session)

    def client_event(self, session: Session, event: dict[str, Any]) -> bool:
        """A client event for the background reasoner; False when the server runs none."""
        return session.background.on_client_event(event)
