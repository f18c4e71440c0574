"""What of a session the store keeps, and how it is put back on another replica.

Carried: the settings and audio formats, the conversation log, the conversation items as the client saw
them (`conversation.item.retrieve`), what a detached session produced for its client (the backlog), and
the background requests not finished yet with what each had already said. Not carried: the model's
state (a restored session's model starts afresh) and the background reasoner's stream itself: a request
in flight is asked again on the new replica, and its client is told so (`duplex.background.reissued`,
with the text the old answer had reached), because the stream cannot move with it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, get_args

import numpy as np

from models.base import Event, TickOutput
from server import protocol as p
from server.background import BackgroundWorker, Policy
from server.conversation import Entry, Role
from server.items import MAX_ITEMS
from server.protocol import SUPPORTED_RATES, AudioFormat
from server.sessions import Pace, Session, SessionSettings
from streaming.pcm import float32_to_pcm16, pcm16_to_float32
from streaming.types import TICK_SAMPLES

SNAPSHOT_VERSION = 1  # later fields are optional: a replica of the previous release writes without them
ROLES: tuple[str, ...] = get_args(Role)
# The backlog carried in a snapshot, newest first, up to this many bytes of JSON; what is older is
# counted as dropped and the client told so on resume. A detached session is not stepped, so its
# backlog is mostly background events and the few micro-turns that were in flight.
MAX_BACKLOG_JSON = 1 << 20
MAX_CARRIED_REQUESTS = 8  # the running background request and those queued behind it


def snapshot(session: Session) -> dict[str, Any]:
    s = session.settings
    backlog, dropped = _backlog(session)
    return {
        "v": SNAPSHOT_VERSION,
        "settings": {"pace": s.pace.value, "in_rate": s.in_format.rate, "out_rate": s.out_format.rate,
                     "instructions": s.instructions, "tools": s.tools, "tick_stats": s.tick_stats,
                     "tool_choice": s.tool_choice, "output_modality": s.output_modality},
        "log": [asdict(e) for e in session.log.entries],
        "tick": session.tick,
        "items": session.items.all(),
        "backlog": backlog,
        "backlog_dropped": dropped,
        "background": _unfinished(session),
    }


def fingerprint(snap: dict[str, Any]) -> str:
    """Changes whenever the snapshot's content does (the tick aside: it changes every micro-turn)."""
    body = {k: v for k, v in snap.items() if k != "tick"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _unfinished(session: Session) -> list[dict[str, str]]:
    worker = session.background
    if not isinstance(worker, BackgroundWorker):
        return []
    return [{"id": r.id, "query": r.query, "source": r.source, "said": r.said}
            for r in worker.unfinished_requests()[:MAX_CARRIED_REQUESTS]]


def _backlog(session: Session) -> tuple[list[dict[str, Any]], int]:
    """The backlog as JSON-able entries (oldest first), cut to MAX_BACKLOG_JSON; and how many are gone."""
    kept: list[dict[str, Any]] = []
    size = 0
    entries = session.backlog.entries()
    for n, (item, tick) in enumerate(reversed(entries)):
        entry = _output_json(item, tick) if isinstance(item, TickOutput) else {"event": item}
        size += len(json.dumps(entry, separators=(",", ":"), default=str))
        if size > MAX_BACKLOG_JSON:
            return kept[::-1], session.backlog.dropped + len(entries) - n
        kept.append(entry)
    return kept[::-1], session.backlog.dropped


def _output_json(out: TickOutput, tick: int) -> dict[str, Any]:
    # Audio as PCM16 (what the client gets anyway), nothing for silence: most held outputs are silent.
    audio = "" if out.silent else base64.b64encode(float32_to_pcm16(out.audio)).decode()
    events = [{"type": e.type, "data": json.loads(json.dumps(e.data, default=str))} for e in out.events]
    return {"tick": tick, "audio": audio, "text": out.text, "user_text": out.user_text, "events": events}


@dataclass(frozen=True)
class Carried:
    """A background request that had not finished on the replica the session left."""

    id: str
    query: str
    source: str
    said: str  # what its answer had reached (the client saw it in duplex.background.delta events)


@dataclass(frozen=True)
class Restored:
    """A snapshot read back and checked: what a freshly opened session takes over."""

    settings: SessionSettings
    entries: list[Entry]
    items: list[dict[str, Any]] = field(default_factory=list)
    backlog: list[tuple[TickOutput | dict[str, Any], int]] = field(default_factory=list)  # (item, tick)
    backlog_dropped: int = 0
    background: list[Carried] = field(default_factory=list)


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
        tool_choice = st.get("tool_choice", "auto")  # both absent from a previous release's snapshot
        if not (tool_choice in ("auto", "none", "required") or (
                isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
                and isinstance(tool_choice.get("name"), str))):
            raise ValueError(f"tool_choice {str(tool_choice)[:80]!r} is not one the API allows")
        modality = st.get("output_modality", "audio")
        if modality not in ("audio", "text"):
            raise ValueError(f"output_modality {str(modality)[:20]!r} is not audio or text")
        settings = SessionSettings(pace=Pace(st["pace"]), in_format=AudioFormat(int(st["in_rate"])),
                                   out_format=AudioFormat(int(st["out_rate"])),
                                   instructions=str(st["instructions"]), tools=list(st["tools"]),
                                   tick_stats=bool(st["tick_stats"]),
                                   tool_choice={"type": "function", "name": tool_choice["name"]}
                                   if isinstance(tool_choice, dict) else str(tool_choice),
                                   output_modality=str(modality))
        entries = []
        for e in snap["log"]:
            role = e["role"]
            if role not in ROLES:
                raise ValueError(f"conversation role {role!r} is not one of {ROLES}")
            entries.append(Entry(float(e["t"]), role, str(e["text"]), str(e["kind"])))
        items = list(snap.get("items", []))[-MAX_ITEMS:]
        if not all(isinstance(i, dict) and isinstance(i.get("id"), str) for i in items):
            raise ValueError("conversation items must be objects with a string id")
        backlog = [_backlog_entry(b) for b in snap.get("backlog", [])]
        carried = [Carried(str(r["id"]), str(r["query"]), str(r["source"]), str(r["said"]))
                   for r in snap.get("background", [])[:MAX_CARRIED_REQUESTS]]
        dropped = int(snap.get("backlog_dropped", 0))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"session snapshot is not readable: {type(exc).__name__}: {exc}") from None
    return Restored(settings, entries, items, backlog, max(0, dropped), carried)


def _backlog_entry(b: dict[str, Any]) -> tuple[TickOutput | dict[str, Any], int]:
    if "event" in b:
        event = b["event"]
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ValueError("a backlog event must be an object with a string type")
        return event, -1
    pcm = base64.b64decode(b["audio"], validate=True)
    if len(pcm) not in (0, 2 * TICK_SAMPLES):
        raise ValueError(f"a backlog output holds {len(pcm)} bytes of audio, not one micro-turn")
    audio = pcm16_to_float32(pcm) if pcm else np.zeros(TICK_SAMPLES, np.float32)
    events = [Event(str(e["type"]), dict(e["data"])) for e in b["events"]]
    return TickOutput(audio, str(b["text"]), str(b["user_text"]), events), int(b["tick"])


def restore(session: Session, restored: Restored) -> None:
    """Put a checked snapshot's settings, conversation, items and backlog into a freshly opened session
    (before it is attached: the runtime hands the backlog to its client when it seats it)."""
    session.settings = restored.settings
    session.log.entries.extend(restored.entries)
    for item in restored.items:
        session.items.put(item)
    for entry, tick in restored.backlog:
        if isinstance(entry, TickOutput):
            session.backlog.add_output(entry, tick)
        else:
            session.backlog.add_event(entry)
    session.backlog.dropped += restored.backlog_dropped


def reissue(session: Session, restored: Restored) -> None:
    """Once the restored session is attached and its backlog handed over: ask the background requests
    that were in flight again here, or tell the client they are lost."""
    worker = session.background
    for req in restored.background:
        if not isinstance(worker, BackgroundWorker):
            session.emit(p.error_event("background_lost", f"background request {req.id} was still running when "
                                       "the session moved, and this server runs no reasoner to ask it again",
                                       kind="server_error"))
            continue
        # Queued, so several carried requests run in their old order instead of superseding each other.
        new_id = worker.request(req.query, source=req.source, policy=Policy.QUEUE)
        session.emit({"type": "duplex.background.reissued", "event_id": p.new_id("event"), "request_id": new_id,
                      "previous_request_id": req.id, "query": req.query, "said": req.said,
                      "message": "the server answering this request went away; it was asked again here and "
                      "its answer starts over (what it had said is in 'said')"})
