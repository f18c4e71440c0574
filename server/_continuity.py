"""What of a session the store keeps, and how it is put back: settings and the conversation log.

The model's state is not in it: a session restored on another replica starts its model afresh (the
native model's KV cache rebuilt by replaying a logged input, bit-identical, is a later step).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, get_args

from server.conversation import Entry, Role
from server.protocol import SUPPORTED_RATES, AudioFormat
from server.sessions import Pace, Session, SessionSettings

SNAPSHOT_VERSION = 1
ROLES: tuple[str, ...] = get_args(Role)


def snapshot(session: Session) -> dict[str, Any]:
    s = session.settings
    return {
        "v": SNAPSHOT_VERSION,
        "settings": {"pace": s.pace.value, "in_rate": s.in_format.rate, "out_rate": s.out_format.rate,
                     "instructions": s.instructions, "tools": s.tools, "tick_stats": s.tick_stats},
        "log": [asdict(e) for e in session.log.entries],
        "tick": session.tick,
    }


def fingerprint(snap: dict[str, Any]) -> str:
    """Changes whenever the snapshot's content does (the tick aside: it changes every micro-turn)."""
    body = {k: v for k, v in snap.items() if k != "tick"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Restored:
    """A snapshot read back and checked: what a freshly opened session takes over."""

    settings: SessionSettings
    entries: list[Entry]


def parse(snap: Any) -> Restored:
    """Check a snapshot read from the store; ValueError says what is wrong with it. The store is shared
    by every replica (and by whatever else can reach it): nothing in it is trusted until read here, so
    a bad one is refused before a session is opened or a lease is taken for it."""
    try:
        if snap.get("v") != SNAPSHOT_VERSION:
            raise ValueError(f"version {snap.get('v')!r} is not {SNAPSHOT_VERSION}")
        st = snap["settings"]
        for key in ("in_rate", "out_rate"):
            if int(st[key]) not in SUPPORTED_RATES:
                raise ValueError(f"{key} {st[key]!r} is not one of {SUPPORTED_RATES}")
        if not all(isinstance(t, dict) for t in st["tools"]):
            raise ValueError("tools must be objects")
        settings = SessionSettings(pace=Pace(st["pace"]), in_format=AudioFormat(int(st["in_rate"])),
                                   out_format=AudioFormat(int(st["out_rate"])),
                                   instructions=str(st["instructions"]), tools=list(st["tools"]),
                                   tick_stats=bool(st["tick_stats"]))
        entries = []
        for e in snap["log"]:
            role = e["role"]
            if role not in ROLES:
                raise ValueError(f"conversation role {role!r} is not one of {ROLES}")
            entries.append(Entry(float(e["t"]), role, str(e["text"]), str(e["kind"])))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"session snapshot is not readable: {type(exc).__name__}: {exc}") from None
    return Restored(settings, entries)


def restore(session: Session, restored: Restored) -> None:
    """Put a checked snapshot's settings and conversation into a freshly opened session."""
    session.settings = restored.settings
    session.log.entries.extend(restored.entries)
