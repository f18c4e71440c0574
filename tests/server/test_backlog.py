"""The events kept for a detached session (server/backlog.py): bounded in items and in bytes."""

from __future__ import annotations

from typing import Any

import numpy as np

from models.base import TickOutput
from server.backlog import Backlog


class Replayed:
    def __init__(self) -> None:
        self.got: list[tuple[str, Any]] = []

    def deliver(self, out: TickOutput, tick: int) -> None:
        self.got.append(("out", tick))

    def emit(self, event: dict[str, Any]) -> None:
        self.got.append(("event", event["n"]))


def test_text_counts_in_utf8_bytes_and_the_oldest_fall_off_first() -> None:
    silence = np.zeros(4800, np.float32)
    wide = "\U0001f600" * 1000  # 1,000 characters, 4,000 bytes in UTF-8
    # Room for four such outputs were text counted at 2 bytes a character; in bytes, three.
    backlog = Backlog(max_items=100, max_bytes=4 * (silence.nbytes + 2000 + 64) + 100)
    for tick in range(4):
        backlog.add_output(TickOutput(audio=silence, text=wide), tick)
    assert len(backlog) == 3 and backlog.dropped == 1, "the oldest fell off"
    backlog.add_event({"type": "x", "n": 7})
    sink = Replayed()
    assert backlog.replay(sink) == 1, "what fell off is reported once"
    assert sink.got == [("out", 1), ("out", 2), ("out", 3), ("event", 7)], "in order"
    assert len(backlog) == 0 and backlog.bytes == 0 and backlog.dropped == 0
