"""Hypothesis strategies for everything a client can send, each case with the answer the grammar demands.

A case is what one client message (or one HTTP request, or one connection) is, plus `expect`:
  "error"   the grammar says this message is wrong: an `error` event naming it is due;
  "ok"      a well-formed message: no error is due;
  "either"  the grammar does not decide (e.g. `response.cancel` depends on whether a response runs);
  "close"   the WebSocket protocol itself is broken (invalid UTF-8 in a text frame): close 1007 is due.

The expectations come from the protocol as documented (README, OpenAI Realtime), not from reading the
server's validation code: where both disagree, the case reports a violation.

The fuzz sessions live in a known state, which the expectations assume: audio already sent (so pace
and input format are locked), pace `media` on the WebSocket and `realtime` on the data channel, input
24 kHz, no background reasoner (`--background none`).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from server.connection_limits import WS_MESSAGE_SLACK
from server.limits import MAX_INSTRUCTIONS_CHARS, MAX_ITEM_TEXT_CHARS

RATES = (8000, 16000, 24000, 48000)
KNOWN_TYPES = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
               "input_audio_buffer.clear", "conversation.item.create", "response.create", "response.cancel",
               "output_audio_buffer.clear", "duplex.background.request")


@dataclass
class Case:
    target: str  # ws | dc | ws_conn | http
    kind: str  # what the generator built (for the report's breakdown)
    payload: Any  # str or bytes for ws/dc; dict for http and ws_conn
    expect: str  # error | ok | either | close

    def short(self, limit: int = 300) -> str:
        text = repr(self.payload)
        return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


@dataclass
class SessionModel:
    """What the grammar checks depend on: the fuzz session's state, fixed by its set-up."""

    transport: str  # ws | dc
    max_frame_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pace(self) -> str:
        return "media" if self.transport == "ws" else "realtime"


# --- values -----------------------------------------------------------------------------------

EXTREME_INTS = st.sampled_from([0, -1, 1, 2**31, -(2**31) - 1, 2**53 + 1, 2**63, -(2**64), 10**30, 10**400])
HUGE_INT_DIGITS = st.integers(min_value=1, max_value=6000)  # Python refuses int strings past 4300 digits
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e308, -1e308, 5e-324, -0.0])
TEXT = st.text(max_size=40)
BIG_TEXT = st.integers(min_value=0, max_value=120_000).map(lambda n: "x" * n)

scalars = st.none() | st.booleans() | EXTREME_INTS | st.integers() | FLOATS | TEXT
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)


def _not(valid: Any) -> st.SearchStrategy[Any]:
    """Any JSON value except those `valid` accepts (a predicate)."""
    return json_values.filter(lambda v: not valid(v))


# --- valid events and their mutations ------------------------------------------------------------

def _fmt_ok(v: Any) -> bool:
    if v == "pcm16":
        return True
    return (isinstance(v, dict) and v.get("type", "audio/pcm") in ("audio/pcm", "pcm16")
            and type(v.get("rate", 24000)) is int and v.get("rate", 24000) in RATES)


def _fmt_float_rate(v: Any) -> bool:
    """A rate such as 24000.0: the same number as a valid one, written as a float; not decided."""
    return (isinstance(v, dict) and isinstance(v.get("rate"), float) and v.get("rate") in RATES
            and v.get("type", "audio/pcm") in ("audio/pcm", "pcm16"))


formats = st.sampled_from(["pcm16"]) | st.builds(lambda r: {"type": "audio/pcm", "rate": r}, st.sampled_from(RATES))
bad_formats = _not(_fmt_ok) | st.builds(lambda r: {"type": "audio/pcm", "rate": r}, EXTREME_INTS | FLOATS | TEXT)
tools_ok = st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": TEXT},
                                          optional={"description": TEXT, "parameters": json_values}), max_size=3)


def _modalities_ok(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v) and sorted(v) in (["audio"], ["text"],
                                                                                      ["audio", "text"])


def _tools_ok(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in v)


@st.composite
def session_update(draw: st.DrawFn, m: SessionModel) -> tuple[dict[str, Any], str]:
    """A session.update with each field either valid or mutated; the expectation follows the fields."""
    cfg: dict[str, Any] = {}
    due = False
    undecided = False
    if draw(st.booleans()):  # pace: fixed once audio was sent; the WebRTC call always runs in real time
        pace = draw(st.sampled_from(["realtime", "media"]) | json_values)
        cfg["pace"] = pace
        due |= pace != m.pace
    for key in ("input", "output"):
        if draw(st.booleans()):
            f: Any = draw(formats | bad_formats)
            cfg.setdefault("audio", {}).setdefault(key, {})["format"] = f
            if _fmt_float_rate(f):
                undecided = True
            elif not _fmt_ok(f):
                due = True
            elif key == "input" and (24000 if f == "pcm16" else f.get("rate", 24000)) != 24000:
                due = True  # the input format is locked once audio was sent
    if draw(st.booleans()):
        instr = draw(TEXT | BIG_TEXT | json_values)
        cfg["instructions"] = instr
        due |= not isinstance(instr, str) or len(instr) > MAX_INSTRUCTIONS_CHARS
    if draw(st.booleans()):
        tools = draw(tools_ok | json_values)
        cfg["tools"] = tools
        due |= not _tools_ok(tools)
    if draw(st.booleans()):
        ext = draw(st.fixed_dictionaries({}, optional={"tick_stats": json_values}) | json_values)
        cfg["duplex"] = ext
        due |= not isinstance(ext, dict)
    if draw(st.booleans()):  # what responses carry (the beta protocol's name is `modalities`)
        modalities = draw(st.sampled_from([["audio"], ["text"], ["audio", "text"], ["text", "audio"]]) | json_values)
        cfg[draw(st.sampled_from(["output_modalities", "modalities"]))] = modalities
        due |= not _modalities_ok(modalities)
    if draw(st.booleans()):  # a field the grammar does not know: ignored by Realtime servers
        cfg[draw(st.sampled_from(["voice", "temperature", "zzz"]))] = draw(json_values)
    session: Any = cfg
    if draw(st.integers(0, 9)) == 0:
        session = draw(_not(lambda v: isinstance(v, dict)))
        due = True
    ev = {"type": "session.update", "session": session}
    return ev, "error" if due else ("either" if undecided else "ok")


@st.composite
def audio_append(draw: st.DrawFn, m: SessionModel) -> tuple[dict[str, Any], str]:
    choice = draw(st.integers(0, 4))
    ok = "ok" if m.pace == "media" else "either"  # real time: sending ahead may be an input_overrun
    if choice == 0:  # valid: even-length PCM16, any length up to and past the frame limit
        n = draw(st.integers(0, 100) | st.integers(0, m.max_frame_bytes // 2 + 64)) * 2
        head = draw(st.binary(min_size=min(n, 32), max_size=min(n, 32)))
        data = (head + bytes(n))[:n]
        return {"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode()}, \
            "error" if n > m.max_frame_bytes else ok
    if choice == 1:  # odd byte count
        data = draw(st.binary(min_size=1, max_size=301).filter(lambda b: len(b) % 2 == 1))
        return {"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode()}, "error"
    if choice == 2:  # not base64 at all
        text = draw(st.text(min_size=1, max_size=60).filter(lambda s: not _is_b64(s)))
        return {"type": "input_audio_buffer.append", "audio": text}, "error"
    if choice == 3:  # wrong type or missing
        ev: dict[str, Any] = {"type": "input_audio_buffer.append"}
        if draw(st.booleans()):
            ev["audio"] = draw(_not(lambda v: isinstance(v, str)))
        return ev, "error"
    return {"type": "input_audio_buffer.append", "audio": ""}, ok  # no samples: nothing to do


def _is_b64(s: str) -> bool:
    try:
        data = base64.b64decode(s, validate=True)
    except ValueError:
        return False
    return len(data) % 2 == 0


@st.composite
def item_create(draw: st.DrawFn, m: SessionModel) -> tuple[dict[str, Any], str]:
    choice = draw(st.integers(0, 3))
    if choice == 0:  # a valid typed user message
        parts = draw(st.lists(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "text"]),
                                                     "text": TEXT | BIG_TEXT}), min_size=1, max_size=3))
        item: Any = {"type": "message", "role": "user", "content": parts}
        return {"type": "conversation.item.create", "item": item}, _item_expect(item)
    if choice == 1:  # a client tool's output: needs a background reasoner, which the fuzz server lacks
        item = {"type": "function_call_output", "call_id": draw(TEXT), "output": draw(TEXT | json_values)}
        return {"type": "conversation.item.create", "item": item}, "error"
    if choice == 2:  # mutated fields
        item = {"type": draw(st.sampled_from(["message", "function_call", "image", ""]) | json_values),
                "role": draw(st.sampled_from(["user", "assistant", "system"]) | json_values),
                "content": draw(st.lists(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "text",
                                                                                         "input_audio"]),
                                                                "text": json_values}), max_size=3) | json_values)}
        return {"type": "conversation.item.create", "item": item}, _item_expect(item)
    item = draw(json_values)
    return {"type": "conversation.item.create", "item": item}, _item_expect(item)


def _item_expect(item: Any) -> str:
    """Grammar: a user `message` with input_text parts, or a function_call_output (no reasoner here)."""
    if not isinstance(item, dict):
        return "error"
    itype = item.get("type", "message")
    if itype != "message":
        return "error"  # function_call_output without a reasoner, or an item type the server cannot take
    if item.get("role", "user") != "user":
        return "error"
    content = item.get("content")
    if not isinstance(content, list) or not content:
        return "error"
    texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") in ("input_text", "text")]
    strings = [t for t in texts if isinstance(t, str)]
    if not texts or len(strings) != len(texts):
        return "error"
    return _text_size_expect(sum(len(t) for t in strings), len(strings))


def _text_size_expect(chars: int, parts: int) -> str:
    """README: one typed message is at most MAX_ITEM_TEXT_CHARS characters; how parts are joined (the
    separators) is not said, so a message within `parts` characters of the bound is not decided."""
    if chars > MAX_ITEM_TEXT_CHARS:
        return "error"
    return "either" if chars + parts > MAX_ITEM_TEXT_CHARS else "ok"


@st.composite
def simple_event(draw: st.DrawFn, m: SessionModel) -> tuple[dict[str, Any], str]:
    etype = draw(st.sampled_from(["input_audio_buffer.commit", "input_audio_buffer.clear", "response.create",
                                  "response.cancel", "output_audio_buffer.clear", "duplex.background.request"]))
    ev: dict[str, Any] = {"type": etype}
    if draw(st.booleans()):
        ev[draw(st.sampled_from(["response", "item_id", "query", "policy", "zzz"]))] = draw(json_values)
    if etype == "response.cancel":
        return ev, "either"  # due only when no response is running, which depends on the audio so far
    if etype == "duplex.background.request":
        return ev, "error"  # the fuzz server runs no background reasoner
    if etype == "response.create" and ev.get("response") is not None:
        # docs/api.md: `response` is an object of this response's settings, each checked as session.update
        # checks it: anything else is refused (invalid_response); an empty one changes nothing; drawn
        # keys may or may not be settings.
        response = ev["response"]
        return ev, ("error" if not isinstance(response, dict) else "ok" if not response else "either")
    return ev, "ok"


def _with_event_id(draw: st.DrawFn, ev: dict[str, Any]) -> dict[str, Any]:
    if draw(st.integers(0, 3)) == 0:
        ev["event_id"] = draw(TEXT | json_values)
    return ev


@st.composite
def valid_grammar_event(draw: st.DrawFn, m: SessionModel) -> tuple[str, str, str]:
    """(kind, text, expect) for an event of a known type, valid or with mutated fields."""
    maker = draw(st.sampled_from([session_update, audio_append, item_create, simple_event]))
    ev, expect = draw(maker(m))
    ev = _with_event_id(draw, ev)
    text = json.dumps(ev, ensure_ascii=draw(st.booleans()))
    return maker.__name__ if hasattr(maker, "__name__") else "event", text, _size_expect(text, expect, m)


def _size_expect(text: str, expect: str, m: SessionModel) -> str:
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if m.transport == "ws" and size > WS_MESSAGE_SLACK * m.max_frame_bytes:
        return "closed_1009"  # past the WebSocket's message limit: closed before it is read (connection_limits)
    if len(text) > m.max_frame_bytes:
        return "error"
    if size > m.max_frame_bytes:
        return "either"  # over the limit in bytes, under it in characters: which one counts is not said
    return expect


# --- broken messages -------------------------------------------------------------------------------

@st.composite
def broken_text(draw: st.DrawFn, m: SessionModel) -> tuple[str, str, str]:
    choice = draw(st.integers(0, 7))
    if choice == 0:  # not JSON
        text = draw(st.text(max_size=200).filter(lambda s: not _is_json(s)))
        return "not_json", text, "error"
    if choice == 1:  # JSON but not an object
        v = draw(_not(lambda v: isinstance(v, dict)))
        return "not_object", json.dumps(v), "error"
    if choice == 2:  # object without a string type
        obj = draw(st.dictionaries(TEXT, json_values, max_size=4))
        if "type" in obj and isinstance(obj["type"], str):
            obj["type"] = draw(_not(lambda v: isinstance(v, str)))
        return "no_type", json.dumps(obj), "error"
    if choice == 3:  # unknown type
        etype = draw(TEXT.filter(lambda t: t not in KNOWN_TYPES))
        return "unknown_type", json.dumps({"type": etype, **draw(st.dictionaries(TEXT, json_values, max_size=3))}), \
            "error"
    if choice == 4:  # deep nesting, well under the size limit
        depth = draw(st.integers(1, 60_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        closed = draw(st.booleans())
        text = opener * depth + ("1" + closer * depth if closed else "")
        if len(text) > m.max_frame_bytes:
            text = text[: m.max_frame_bytes]
        return "deep_nesting", text, "error"  # never a valid event: invalid JSON or not an event object
    if choice == 5:  # numbers with more digits than Python parses by default
        digits = draw(HUGE_INT_DIGITS)
        field_name = draw(st.sampled_from(["zzz", "event_id", "audio"]))
        # Valid JSON (the grammar sets no limit on digits): accepted or refused, but never fatal.
        return "huge_number", f'{{"type": "response.create", "{field_name}": {"9" * digits}}}', "either"
    if choice == 6:  # JSON extensions Python accepts and the JSON grammar does not: refused (README)
        token = draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
        return "nonstandard_json", f'{{"type": "response.create", "zzz": {token}}}', "error"
    # a valid event cut short
    ev, _ = draw(session_update(m))
    text = json.dumps(ev)
    cut = draw(st.integers(1, max(1, len(text) - 1)))
    return "truncated", text[:cut], "error"


def _is_json(s: str) -> bool:
    try:
        json.loads(s)
    except ValueError:
        return False
    return True


@st.composite
def binary_frame(draw: st.DrawFn, m: SessionModel) -> tuple[str, bytes, str]:
    n = draw(st.integers(0, 200) | st.integers(0, m.max_frame_bytes + 4096))
    head = draw(st.binary(min_size=min(n, 32), max_size=min(n, 32)))
    data = (head + bytes(n))[:n]
    if n > m.max_frame_bytes:
        return "binary", data, "error"
    if n % 2:
        return "binary", data, "error"
    return "binary", data, "ok" if m.pace == "media" else "either"


def message_cases(m: SessionModel, target: str) -> st.SearchStrategy[Case]:
    """Client messages on an open session (WebSocket or data channel)."""
    text = st.one_of(valid_grammar_event(m), valid_grammar_event(m), broken_text(m))
    return st.one_of(
        text.map(lambda t: Case(target, t[0], t[1], t[2])),
        binary_frame(m).map(lambda t: Case(target, t[0], t[1], t[2])),
    )


# --- connection-level (one WebSocket per case) -----------------------------------------------------

@st.composite
def ws_connection_case(draw: st.DrawFn) -> Case:
    choice = draw(st.integers(0, 3))
    if choice == 0:  # a text frame that is not UTF-8: the WebSocket protocol says close with 1007
        raw = draw(st.binary(min_size=1, max_size=64).filter(lambda b: not _utf8(b)))
        return Case("ws_conn", "invalid_utf8", {"text_bytes": raw}, "close")
    if choice == 1:  # the client closes with any code and reason
        code = draw(st.sampled_from([1000, 1001, 1002, 1003, 1007, 1008, 1009, 1011, 3000, 4000, 4999]))
        reason = draw(st.text(max_size=30).filter(lambda s: len(s.encode()) <= 120))
        return Case("ws_conn", "client_close", {"close": code, "reason": reason}, "either")
    if choice == 2:  # resume with a token that names no session
        where = draw(st.sampled_from(["header", "subprotocol", "query"]))  # header first: what clients use
        # A subprotocol is an HTTP token (RFC 7230): no '=' or '%' there, or the client cannot even send it.
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_" + ("" if where == "subprotocol" else "%&=+")
        token = draw(st.text(alphabet=alphabet, min_size=1, max_size=80))
        return Case("ws_conn", "bad_resume_token", {"resume_token": token, "token_in": where}, "error")
    # handshake headers: subprotocols and beta header of any shape
    protos = draw(st.lists(st.sampled_from(["realtime", "openai-beta.realtime-v1", "x", "duplex-api-key.",
                                            "openai-insecure-api-key.k"]), max_size=3, unique=True))
    beta = draw(st.sampled_from(["", "realtime=v1", "realtime=v2", "garbage"]))
    return Case("ws_conn", "handshake", {"subprotocols": protos, "beta": beta}, "either")


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --- WebRTC signalling (HTTP) ------------------------------------------------------------------------

@st.composite
def http_case(draw: st.DrawFn, offer: str, max_offer: int = 64 * 1024) -> Case:
    """POST /v1/realtime/calls (offer bodies, content types, sizes) or a hangup of any id."""
    choice = draw(st.integers(0, 5))
    if choice == 0:
        call_id = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=40))
        return Case("http", "hangup_unknown", {"hangup": call_id}, "error")
    ctype = "application/sdp"
    if choice == 1:
        ctype = draw(st.sampled_from(["", "application/json", "text/html", "application/sdp; charset=utf-8",
                                      "TEXT/PLAIN", "multipart/form-data"]))
    lines = offer.strip().split("\r\n")
    if choice == 2:  # the offer with lines deleted, duplicated or garbled
        for _ in range(draw(st.integers(1, 6))):
            i = draw(st.integers(0, len(lines) - 1))
            op = draw(st.integers(0, 3))
            if op == 0 and len(lines) > 1:
                del lines[i]
            elif op == 1:
                lines.insert(i, lines[i])
            elif op == 2:
                lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
            else:
                lines[i] = draw(st.text(max_size=60).filter(lambda s: "\r" not in s and "\n" not in s))
    elif choice == 3:  # many m-sections (audio/video copies of the offer's first one)
        m_start = next((i for i, ln in enumerate(lines) if ln.startswith("m=")), len(lines))
        section = lines[m_start:]
        lines = lines + section * draw(st.integers(1, 40))
    elif choice == 4:  # sizes around the limit, and random bodies
        body = draw(st.sampled_from(["v=0\r\n", ""])) + draw(st.text(max_size=200))
        pad = draw(st.sampled_from([0, max_offer - 10, max_offer + 1, 4 * max_offer]))
        return Case("http", "body", {"ctype": ctype, "body": body + "a" * pad}, "error")
    body = "\r\n".join(lines) + "\r\n"
    expect = "either"  # an offer may be usable or not; either way the answer is 201 or a 4xx naming why
    if ctype.split(";")[0].strip().lower() not in ("application/sdp", "text/plain"):
        expect = "error"
    if len(body.encode()) > max_offer:
        expect = "error"
    return Case("http", f"offer_{choice}", {"ctype": ctype, "body": body}, expect)
