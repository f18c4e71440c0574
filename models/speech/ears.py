"""Whisper and the text judge on the user's words: what both voices hear a turn's last words with."""

from __future__ import annotations

from dataclasses import dataclass

from models.speech.asr import Transcript, WhisperTranscriber
from models.speech.text_turn import TextTurn
from streaming.types import Audio


@dataclass
class Heard:
    """What a Whisper job heard: its transcript and, when asked, the text model's P(the words are finished)."""

    transcript: Transcript
    p_text: float | None = None


class Ears:
    """Whisper and, where it loaded, the text model that judges Whisper's words; called on worker threads."""

    def __init__(self, whisper: WhisperTranscriber, text_turn: TextTurn | None) -> None:
        self.whisper, self.text_turn = whisper, text_turn

    def hear(self, audio: Audio, judge: bool) -> Heard:
        """Whisper's transcript of `audio`; with `judge`, also the text model's P(finished) of its
        words, in the same job, so both are due at the same micro-turn."""
        transcript = self.whisper.transcribe(audio)
        if not judge or self.text_turn is None or not transcript.text:
            return Heard(transcript)
        return Heard(transcript, self.text_turn.probability(transcript.text))
