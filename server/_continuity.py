"""What of a session the store keeps, and how it is put back: settings and the conversation log.

The model's state is not in it: a session restored on another replica starts its model afresh (the
native model's KV cache rebuilt by replaying a logged input, bit-identical, is a later step).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from server.conversation import Entry
from server.protocol import AudioFormat
from server.sessions import Pace, Session, SessionSettings

SNAPSHOT_VERSION = 1


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


def restore(session: Session, snap: dict[str, Any]) -> None:
    """Put a snapshot's settings and conversation into a freshly opened session."""
    if snap.get("v") != SNAPSHOT_VERSION:
        raise ValueError(f"session snapshot version {snap.get('v')!r} is not {SNAPSHOT_VERSION}")
    st = snap["settings"]
    session.settings = SessionSettings(pace=Pace(st["pace"]), in_format=AudioFormat(int(st["in_rate"])),
                                       out_format=AudioFormat(int(st["out_rate"])),
                                       instructions=str(st["instructions"]), tools=list(st["tools"]),
                                       tick_stats=bool(st["tick_stats"]))
    for e in snap["log"]:
        session.log.entries.append(Entry(float(e["t"]), e["role"], str(e["text"]), str(e["kind"])))
