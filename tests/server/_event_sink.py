"""A session's transport edge for in-process worker tests: records what the client would receive."""

from __future__ import annotations

from typing import Any

from models.base import TickOutput
from server.sessions import Session


class EventSink:
    """The transport edge: records what the client would receive."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def bind(self, session: Session, resumed: bool) -> None:
        pass

    def deliver(self, out: TickOutput, tick: int) -> None:
        pass

    def end(self, code: int, reason: str) -> None:
        pass

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def of(self, etype: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == etype]
