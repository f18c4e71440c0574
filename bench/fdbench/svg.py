"""One sample's timeline as inline SVG: lanes of speech, the scorer's marks and spans, the model's log.

Plain SVG written from Python rather than a plotting library. What is drawn is a handful of
rectangles and lines per sample on a shared time axis; matplotlib (the well-kept candidate) would add
a dependency and produce pictures with no structure: a PNG or a path soup whose elements cannot carry
the sample's numbers. Here every drawn figure is an element with data attributes (a span's
`data-start`, `data-end`, `data-value` beside its `x1`, `x2`), native tooltips (`<title>`), and CSS
classes the page styles and filters, and a test can check a drawing against the scorer's numbers.

The x scale is stated on the `<svg>`: x = `data-x0` + t * `data-pps` (pixels per second).
"""

from html import escape
from typing import Any

from bench.fdbench.timeline import Segment, Span, Timeline

WIDTH = 1000  # px
LABEL_W = 170  # left column holding the lane names
RIGHT = 70  # room for a span's label past the clip's end
LANE_H = 14  # a speech lane's bar
ROW_GAP = 6
SPAN_H = 13  # one measured span
TOP = 16  # row for the marks' labels
AXIS_H = 18


def _f(x: float) -> str:
    return f"{x:.1f}"


def _t(seconds: float) -> str:
    return f"{seconds:.2f} s"


class _Canvas:
    def __init__(self, duration: float) -> None:
        self.duration = max(duration, 1.0)
        self.pps = (WIDTH - LABEL_W - RIGHT) / self.duration
        self.parts: list[str] = []
        self.y = TOP

    def x(self, t: float) -> float:
        return LABEL_W + t * self.pps

    def add(self, s: str) -> None:
        self.parts.append(s)

    def label(self, text: str, height: float, cls: str = "lane-label") -> None:
        self.add(f'<text class="{cls}" x="{LABEL_W - 6}" y="{_f(self.y + height / 2 + 4)}" '
                 f'text-anchor="end">{escape(text)}</text>')

    def bars(self, segments: list[Segment], cls: str, who: str, height: float = LANE_H,
             special: list[Segment] | None = None) -> None:
        for s, e in segments:
            extra = " bc" if special and any(abs(s - a) < 1e-6 and abs(e - b) < 1e-6 for a, b in special) else ""
            note = " (counted as a backchannel)" if extra else ""
            self.add(f'<rect class="{cls}{extra}" x="{_f(self.x(s))}" y="{_f(self.y)}" '
                     f'width="{_f(max(1.0, (e - s) * self.pps))}" height="{height}" rx="2">'
                     f"<title>{escape(who)} {s:.2f}-{e:.2f} s{note}</title></rect>")


def _words(c: _Canvas, words: list[tuple[str, float, float | None]]) -> None:
    """Each ASR word as a tick under its speech lane, the word in its tooltip."""
    for text, s, e in words:
        end = e if e is not None else s
        c.add(f'<rect class="word" x="{_f(c.x(s))}" y="{_f(c.y + LANE_H + 1)}" '
              f'width="{_f(max(1.5, (end - s) * c.pps))}" height="3"><title>{escape(text)} '
              f"{s:.2f} s</title></rect>")


def _span(c: _Canvas, span: Span, run: int, failed: bool) -> None:
    x1, x2 = c.x(span.start), c.x(span.end)
    y = c.y + SPAN_H / 2
    sign = "+" if span.metric == "raw_latency" and span.value >= 0 else ""
    text = f"{span.label} {sign}{span.value:.2f} s"
    cls = "span fail" if failed else "span"
    c.add(f'<g class="{cls}" data-run="{run}" data-metric="{span.metric}" data-start="{span.start:.4f}" '
          f'data-end="{span.end:.4f}" data-value="{span.value:.4f}">'
          f"<title>{escape(text)}: from {span.start:.2f} s to {span.end:.2f} s</title>"
          f'<line x1="{_f(x1)}" y1="{_f(y)}" x2="{_f(x2)}" y2="{_f(y)}"/>'
          f'<line class="cap" x1="{_f(x1)}" y1="{_f(y - 4)}" x2="{_f(x1)}" y2="{_f(y + 4)}"/>'
          f'<circle cx="{_f(x2)}" cy="{_f(y)}" r="3"/>'
          f'<text x="{_f(max(x1, x2) + 6)}" y="{_f(y + 4)}">{escape(text)}</text></g>')


# The server's log, by what an event says about the model (client.LOGGED): what it heard, and what it
# decided or said. `duplex.event`s are the model's own, named in their text.
_HEARD_EVENTS = {"user_partial"}  # streaming partial transcripts: many a turn, drawn as ticks
_DID = {  # log event type -> (css class, what it means)
    "response.created": ("created", "response started"),
    "response.done": ("done", "response done"),
    "response.output_audio_transcript.done": ("said-text", "said"),
    "response.output_audio_transcript.delta": ("said-text", "began saying"),
    "error": ("error", "error"),
}


def _glyph(cls: str, x: float, mid: float) -> str:
    if cls.startswith("created"):
        return f'<path d="M{_f(x)} {_f(mid - 5)} l7 5 l-7 5 z"/>'
    if cls.startswith("done"):
        return f'<rect x="{_f(x - 4)}" y="{_f(mid - 4)}" width="8" height="8"/>'
    if cls in ("heard-text", "said-text"):
        return f'<circle cx="{_f(x)}" cy="{_f(mid)}" r="3"/>'
    if cls == "partial":
        return f'<rect x="{_f(x - 0.5)}" y="{_f(mid - 5)}" width="1" height="10"/>'
    return f'<path d="M{_f(x)} {_f(mid - 5)} l5 5 l-5 5 l-5 -5 z"/>'


def _decisions(c: _Canvas, events: list[dict[str, Any]]) -> None:
    """The server's log in two rows: what the model heard (user speech as a bar, partial transcripts as
    ticks, the final one as a dot) and what it did (responses, its own events, named, and errors)."""
    heard_mid, did_mid = c.y + LANE_H / 2, c.y + LANE_H + ROW_GAP + LANE_H / 2
    started: float | None = None
    last_label, last_did = -1e9, -1e9
    for ev in events:
        t, kind, text = float(ev["t"]), str(ev.get("type", "")), str(ev.get("text") or "")
        x = c.x(t)
        if kind == "input_audio_buffer.speech_started":
            started = t
            continue
        if kind == "input_audio_buffer.speech_stopped":
            s = started if started is not None else t
            c.add(f'<rect class="heard" x="{_f(c.x(s))}" y="{_f(heard_mid - 2)}" '
                  f'width="{_f(max(1.0, (t - s) * c.pps))}" height="4">'
                  f"<title>the model heard user speech {s:.2f}-{t:.2f} s</title></rect>")
            started = None
            continue
        if kind == "conversation.item.input_audio_transcription.completed":
            cls, what, mid = "heard-text", "heard the user say", heard_mid
        elif kind == "duplex.event" and text in _HEARD_EVENTS:
            cls, what, mid = "partial", "partial transcript", heard_mid
        elif kind == "duplex.event":
            cls, what, mid = "model", "model event", did_mid
        else:
            cls, what = _DID.get(kind, ("model", kind))
            mid = did_mid
        if kind == "response.done" and text and text != "completed":
            cls += " cut"
        tip = escape(f"{t:.2f} s (micro-turn {ev.get('tick')}): {what}{': ' + text if text else ''}")
        if mid == did_mid:  # events of one micro-turn side by side, not on top of each other (data-t is exact)
            x = last_did = max(x, last_did + 9)
        name = ""
        if cls == "model" and x - last_label > 60:  # name the model's decisions where there is room
            # under the glyph: beside it, the glyphs of the next micro-turns would cover it
            name, last_label = f'<text x="{_f(x - 3)}" y="{_f(mid + 15)}">{escape(text)}</text>', x
        c.add(f'<g class="ev {cls}" data-t="{t:.3f}" data-type="{escape(kind)}">'
              f"<title>{tip}</title>{_glyph(cls, x, mid)}{name}</g>")
    if started is not None:  # speech still going when the log ended
        c.add(f'<rect class="heard" x="{_f(c.x(started))}" y="{_f(heard_mid - 2)}" '
              f'width="{_f(max(1.0, (c.duration - started) * c.pps))}" height="4"/>')


def _marks(c: _Canvas, tl: Timeline, top: float, bottom: float) -> None:
    for m in tl.marks:
        x = c.x(m.start)
        if m.end is None:
            c.add(f'<g class="mark" data-start="{m.start:.4f}"><title>{escape(m.label)} {m.start:.2f} s</title>'
                  f'<line x1="{_f(x)}" y1="{_f(top)}" x2="{_f(x)}" y2="{_f(bottom)}"/></g>')
        else:
            c.add(f'<g class="mark region" data-start="{m.start:.4f}" data-end="{m.end:.4f}">'
                  f"<title>{escape(m.label)} {m.start:.2f}-{m.end:.2f} s</title>"
                  f'<rect x="{_f(x)}" y="{_f(top)}" width="{_f(max(1.0, (m.end - m.start) * c.pps))}" '
                  f'height="{_f(bottom - top)}"/></g>')
        c.add(f'<text class="mark-label" x="{_f(x + 2)}" y="{_f(top - 4)}">{escape(m.label)}</text>')


def _axis(c: _Canvas) -> None:
    step = 1 if c.duration <= 20 else 2 if c.duration <= 40 else 5
    y = c.y
    c.add(f'<line class="axis" x1="{LABEL_W}" y1="{y}" x2="{_f(c.x(c.duration))}" y2="{y}"/>')
    t = 0
    while t <= c.duration + 1e-9:
        x = c.x(t)
        c.add(f'<line class="axis" x1="{_f(x)}" y1="{y}" x2="{_f(x)}" y2="{y + 4}"/>'
              f'<text class="tick" x="{_f(x)}" y="{y + 14}" text-anchor="middle">{t}s</text>')
        t += step
    c.y += AXIS_H


def draw(timelines: list[Timeline], labels: list[str]) -> str:
    """One card's SVG: the shared user lane, then per run its speech, spans and log; `labels[i]`
    names run i."""
    first = timelines[0]
    # The log may go on past the clip (a reply that ends after the input did): the axis runs to it.
    c = _Canvas(max(t.duration for t in timelines)
                + max([0.0] + [float(e["t"]) - t.duration + 0.2 for t in timelines for e in t.decisions or []]))
    top = c.y
    # 1. lanes, top to bottom; the marks are drawn behind them afterwards, over the full height
    c.label("user (input VAD)", LANE_H)
    c.bars(first.user, "user", "user speech")
    c.y += LANE_H + ROW_GAP + 4
    for tl in timelines:
        name = labels[tl.run]
        c.label(f"{name}: assistant", LANE_H, "lane-label run")
        c.bars(tl.assistant, "asst", f"{name} speech", special=tl.backchannels)
        _words(c, tl.words)
        c.y += LANE_H + ROW_GAP
        if tl.clean is not None:
            c.label("same, clean input", LANE_H - 4)
            c.bars(tl.clean, "clean", f"{name} speech without the overlap", height=LANE_H - 4)
            c.y += LANE_H - 4 + ROW_GAP
        for span in tl.spans:
            _span(c, span, tl.run, tl.verdict == "fail")
            c.y += SPAN_H
        if tl.decisions is not None:
            c.label("model heard (log)", LANE_H)
            c.y += LANE_H + ROW_GAP
            c.label("model did (log)", LANE_H)
            c.y -= LANE_H + ROW_GAP
            _decisions(c, tl.decisions)
            c.y += 2 * (LANE_H + ROW_GAP) + 8  # room for the event names
        c.y += 4
    bottom = c.y
    _axis(c)
    marks: list[str] = []
    c.parts, body = marks, c.parts
    _marks(c, first, top, bottom)
    height = c.y
    return (f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{_f(height)}" '
            f'viewBox="0 0 {WIDTH} {_f(height)}" data-x0="{LABEL_W}" data-pps="{c.pps:.6f}">'
            + "".join(marks) + "".join(body) + "</svg>")
