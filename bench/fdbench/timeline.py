"""Per-sample timelines for the HTML report: who spoke when, and where the scorer looked.

For every scored sample of a run this gathers, on the input's timeline (seconds):

- the user's speech and the assistant's speech as Silero VAD segments, with the very call the scorer
  makes (`align.speech_segments` of 16 kHz audio): `input.wav`, `output.wav` and, for v1.5,
  `clean_output.wav` (the answer to the same input without the overlap);
- the events the scorer keys on, read with the scorer's own readers (`layout.turn_end`, ...);
- the spans it measured, rebuilt from the scorer's per-sample row (`score.score(...)["samples"]`): a
  span starts at the reference time and is exactly as long as the row's number, so a drawing cannot
  disagree with the table;
- what each side said where the run has it: the set's annotation texts, the scorer's ASR words
  (`output.json`), and the server's per-micro-turn log (`output.events.json`, written by `run`);
- a verdict, which is this report's reading of the scorer's numbers and not an official figure
  (`verdict` says the rule for every task).

Nothing here draws; `svg.py` draws a `Timeline`, `html_report.py` lays the page out.
"""

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.fdbench import align, metrics
from bench.fdbench.layout import Sample, interruption_span, overlap_span, turn_end
from streaming.wav import read_wav

Segment = tuple[float, float]


@dataclass
class Span:
    """One measured figure drawn as an interval: from the reference the scorer measured from to
    reference + the scorer's number (which may lie before the reference: a negative raw latency)."""

    metric: str  # key of the scorer's row that holds the number
    label: str  # what a reader sees
    start: float  # the reference time (s)
    end: float  # start + value (s)
    value: float  # the scorer's number, as it is in its row


@dataclass
class Mark:
    """An instant or an interval of the input the scorer keys on (turn end, interruption, pause)."""

    label: str
    start: float
    end: float | None = None  # None: an instant


@dataclass
class Timeline:
    """Everything the report shows about one sample of one run; `asdict` of it goes into the page."""

    run: int  # index of the run in the report
    name: str  # "group/folder", as in the scorer's rows
    task: str  # the task folder (group)
    kind: str  # pause | turn_taking | interruption | backchannel | overlap
    duration: float  # input length, s
    input_id: str  # digest of input.wav: runs on the same input share a card
    user: list[Segment] = field(default_factory=list)  # VAD of input.wav
    assistant: list[Segment] = field(default_factory=list)  # VAD of output.wav
    clean: list[Segment] | None = None  # VAD of clean_output.wav (v1.5), else None
    words: list[tuple[str, float, float | None]] = field(default_factory=list)  # output.json (scorer's ASR)
    transcribed: bool = False  # whether the run has an output.json (the scorer does not transcribe every task)
    backchannels: list[Segment] = field(default_factory=list)  # the segments the scorer counted
    marks: list[Mark] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    user_text: str = ""  # from the set's annotations
    decisions: list[dict[str, Any]] | None = None  # output.events.json (t, tick, type, text), if the run has it
    verdict: str = "pass"  # pass | fail | error
    reasons: list[str] = field(default_factory=list)  # why it failed (or the scorer's error)
    scores: dict[str, Any] = field(default_factory=dict)  # the scorer's row, unchanged


def verdict(task: str, kind: str, row: dict[str, Any]) -> list[str]:
    """Why a sample failed, by the direction each task's figures are better in; [] when it passed.

    pause and backchannel: taking the floor (TOR 1) fails. Turn-taking: no take-over fails, and so
    does a take-over that started before the user finished (the official latency floors that to 0).
    v1.0 interruption: no reply after it (TOR 0). v1.5: a user interruption fails when the model
    kept talking through it or (TOR 0) did not reply after it; a backchannel, a remark to someone
    else or background speech fails when the model stopped for it (kept talking vs clean: False) or
    started speaking after it where its clean run did not.
    """
    why: list[str] = []
    tor = row.get("tor")
    if kind == "pause" and tor == 1:
        why.append("took the floor during the pause (TOR 1)")
    elif kind == "turn_taking":
        if tor == 0:
            why.append("did not take the turn (TOR 0)")
        elif (row.get("raw_latency") or 0.0) < 0:
            why.append(f"started {-row['raw_latency']:.2f} s before the user finished")
    elif kind == "interruption" and tor == 0:
        why.append("no reply after the interruption (TOR 0)")
    elif kind == "backchannel" and tor == 1:
        why.append("took the floor instead of backchannelling (TOR 1)")
    elif kind == "overlap":
        if task == "user_interruption":
            if row.get("kept_talking"):
                why.append("kept talking through the interruption")
            if tor == 0:
                why.append("no reply after the interruption (TOR 0)")
        else:
            if row.get("kept_talking_vs_clean") is False:
                why.append(f"stopped for {task.replace('_', ' ')} it should have talked through")
            if row.get("response_latency") is not None and row.get("clean_response_latency") is None:
                why.append("started speaking after the overlap; without it, it did not")
    return why


def _spans(sample: Sample, kind: str, row: dict[str, Any], words: list[metrics.Word]) -> list[Span]:
    """The scorer's measured figures as spans, from the same references the scorer used."""
    out: list[Span] = []

    def add(metric: str, label: str, ref: float, value: float | None) -> None:
        if value is not None:
            out.append(Span(metric, label, ref, ref + value, value))

    if kind == "pause" and row.get("tor") == 1 and words:
        # The take-over the TOR rule measured: first word start to last word end.
        last = words[-1].end if words[-1].end is not None else words[-1].start
        add("tor", "took the floor", words[0].start, last - words[0].start)
    elif kind == "turn_taking":
        add("raw_latency", "latency", turn_end(sample), row.get("raw_latency"))
    elif kind == "interruption":
        start, end = interruption_span(sample)
        add("stop_latency", "stop", start, row.get("stop_latency"))
        add("latency", "latency", end, row.get("latency"))
    elif kind == "overlap":
        start, end = overlap_span(sample)
        add("stop_latency", "stop", start, row.get("stop_latency"))
        add("response_latency", "response", end, row.get("response_latency"))
        add("latency", "latency (ASR)", end, row.get("latency"))
    return out


def _marks(sample: Sample, kind: str) -> list[Mark]:
    if kind == "pause":
        pause = json.loads(sample.file("pause.json").read_text(encoding="utf-8"))[0]["timestamp"]
        return [Mark("user pause", float(pause[0]), float(pause[1]))]
    if kind == "turn_taking":
        return [Mark("user turn end", turn_end(sample))]
    if kind == "interruption":
        return [Mark("interruption", *interruption_span(sample))]
    if kind == "overlap":
        return [Mark(sample.group.replace("_", " "), *overlap_span(sample))]
    return []


def _user_text(sample: Sample) -> str:
    """What the user says, from the set's annotations (official files or the generator's)."""
    try:
        if sample.file("transcription.json").exists():
            return str(json.loads(sample.file("transcription.json").read_text(encoding="utf-8")).get("text", ""))
        if sample.kind == "interruption":
            data = json.loads(sample.file("interrupt.json").read_text(encoding="utf-8"))[0]
            return f"{data.get('context', '')} | interruption: {data.get('interrupt', '')}"
        if sample.kind == "overlap":
            data = json.loads(sample.file("metadata.json").read_text(encoding="utf-8"))
            return f"{data.get('context_text', '')} | overlap: {data.get('current_turn_text', '')}"
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        pass  # annotations a user brought in another shape: the timeline is still worth drawing
    return ""


def _decisions(sample: Sample) -> list[dict[str, Any]] | None:
    path = sample.file("output.events.json")
    if not path.exists():
        return None
    try:
        events = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return [e for e in events if isinstance(e, dict) and isinstance(e.get("t"), int | float)]


def _words(sample: Sample) -> list[metrics.Word]:
    path = sample.file("output.json")
    if not path.exists():
        return []
    try:
        return align.words_of(sample, json.loads(path.read_text(encoding="utf-8")), "output.json")
    except Exception:  # a transcript in another shape: draw without words
        return []


class UserVad:
    """VAD of inputs, once per distinct input.wav (several runs of one set share their inputs)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[list[Segment], float]] = {}

    def __call__(self, path: Path) -> tuple[str, list[Segment], float]:
        raw = path.read_bytes()
        key = hashlib.sha1(raw).hexdigest()[:16]
        if key not in self._cache:
            audio, _ = read_wav(path, rate=align.RATE)
            self._cache[key] = (align.speech_segments(audio), len(audio) / align.RATE)
        return (key, *self._cache[key])


def sample_timeline(run: int, sample: Sample, row: dict[str, Any] | None, error: str | None,
                    user_vad: UserVad) -> Timeline:
    """The timeline of one sample; `row` is the scorer's row, or None with the scorer's `error`."""
    try:
        input_id, user, duration = user_vad(sample.file("input.wav"))
    except Exception as e:  # soundfile raises several types; the scorer has named this sample already
        tl = Timeline(run, sample.name, sample.group, sample.kind, 0.0, sample.name)
        tl.verdict, tl.reasons = "error", [error or f"input.wav is unreadable ({e})"]
        return tl
    tl = Timeline(run, sample.name, sample.group, sample.kind, duration, input_id, user=user)
    tl.user_text = _user_text(sample)
    tl.decisions = _decisions(sample)
    if row is None:
        tl.verdict, tl.reasons = "error", [error or "not scored"]
        return tl
    tl.scores = row
    try:
        # 1. what the scorer heard: VAD of the output(s) and the ASR words it wrote
        tl.assistant = align.speech_segments(align.read_output(sample))
        if sample.kind == "overlap" and sample.file("clean_output.wav").exists():
            tl.clean = align.speech_segments(align.read_output(sample, "clean_output.wav"))
        words = _words(sample)
        tl.transcribed = sample.file("output.json").exists()
        tl.words = [(w.text, w.start, w.end) for w in words]
        # 2. where it looked and what it measured
        tl.marks = _marks(sample, sample.kind)
        tl.spans = _spans(sample, sample.kind, row, words)
        if sample.kind == "backchannel":
            _, tl.backchannels = metrics.backchannel_tor(tl.assistant, words)
    except Exception as e:  # the scorer read these files already; a report must not stop on one sample
        tl.verdict, tl.reasons = "error", [f"cannot draw: {type(e).__name__}: {e}"]
        return tl
    # 3. the verdict
    tl.reasons = verdict(sample.group, sample.kind, row)
    tl.verdict = "fail" if tl.reasons else "pass"
    return tl


def run_timelines(run: int, samples: list[Sample], result: dict[str, Any], user_vad: UserVad,
                  progress: bool = True) -> list[Timeline]:
    """Timelines of every sample of one scored run (`result` from `score.score`)."""
    rows, errors = result["samples"], result["errors"]
    todo = [s for s in samples if s.name in rows or s.name in errors]
    return [
        sample_timeline(run, s, rows.get(s.name), errors.get(s.name), user_vad)
        for s in tqdm(todo, desc=f"timelines {result['label']}", unit="sample", disable=not progress)
    ]
