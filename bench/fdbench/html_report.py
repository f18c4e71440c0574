"""`report --html`: one self-contained page comparing runs, with a timeline for every sample.

The page holds (no network, no external scripts or fonts; opens from disk):

1. the runs (label, model, pace, data folder) and two tables: the official v1.0 columns beside the
   published rows (`report.PUBLISHED`), and every figure the scorer computed for every task, each
   with the direction that is better (↑/↓) and the best run's value in bold;
2. one card per sample (runs made on the same input share a card, one lane group per run), failed
   samples first, filterable by task, by verdict and by "the runs disagree", each with its SVG
   timeline (`svg.py`) and what each side said;
3. the data every card was drawn from, as JSON in `<script type="application/json" id="fdb-data">`:
   the scorer's rows unchanged next to the spans drawn from them.

Scoring is `score.score` itself (it reuses `output.json` transcripts when fresh, as `score` does), so
the page's numbers are the table's numbers.
"""

import json
import math
import time
from dataclasses import asdict
from html import escape
from pathlib import Path
from typing import Any

from bench.fdbench import report, score, svg
from bench.fdbench.layout import GENERATED_V1_TASKS, V1_TASKS, V15_TASKS, find_samples
from bench.fdbench.timeline import Timeline, UserVad, run_timelines

_ORDER = {g: i for i, g in enumerate([*V1_TASKS, *GENERATED_V1_TASKS, *V15_TASKS])}
_SHOULD_CONTINUE = ("user_backchannel", "talking_to_other", "background_speech")


def direction(group: str, kind: str, metric: str) -> str:
    """"↑" when higher is better, "↓" when lower is, "" when neither (context, or a baseline)."""
    if metric == "tor":
        return "↓" if kind in ("pause", "backchannel") else "↑"
    if metric in ("latency", "early_speech_rate", "jsd"):
        return "↓"
    if metric == "frequency":
        return "↑"
    if kind == "interruption" and metric == "stop_latency":
        return "↓"
    if kind == "overlap" and metric in ("stop_latency", "response_latency"):
        return "↓" if group == "user_interruption" else ""
    if metric in ("kept_talking_rate", "kept_talking_vs_clean_rate"):
        return "↓" if group == "user_interruption" else "↑" if group in _SHOULD_CONTINUE else ""
    return ""


def _num(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3f}"
    return escape(str(v))


def _best(values: list[Any], arrow: str) -> Any:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(nums) < 2 or not arrow:
        return None
    return max(nums) if arrow == "↑" else min(nums)


def _row(name: str, arrow: str, values: list[Any], extra: tuple[Any, ...] = ()) -> str:
    best = _best(values, arrow)
    cells = "".join(
        f'<td class="{"best" if best is not None and v == best else ""}">{_num(v)}</td>'
        if not isinstance(v, str) else '<td class="na">n/a offline</td>'
        for v in values
    )
    pub = "".join(f'<td class="pub">{_num(v)}</td>' for v in extra)
    return f'<tr><th>{escape(name)}</th><td class="dir">{arrow}</td>{cells}{pub}</tr>'


def summary(results: list[dict[str, Any]], labels: list[str]) -> str:
    """The two tables: official columns beside the published rows, then every figure of every task."""
    runs = "".join(f"<th>{escape(label)}</th>" for label in labels)
    pubs = "".join(f'<th class="pub">{escape(n)}</th>' for n, _ in report.PUBLISHED)
    official = [
        _row(header[:-2], header[-1], [r["tasks"].get(g, {}).get(m) for r in results],
             tuple(values[i] for _, values in report.PUBLISHED))
        for i, ((g, m), header) in enumerate(zip(report.COLUMNS, report.HEADERS[1:], strict=True))
    ]
    groups = sorted({g for r in results for g in r["tasks"]}, key=lambda g: _ORDER.get(g, 99))
    every: list[str] = []  # one small table per task, side by side as the page's width allows
    for g in groups:
        kind = next(r["tasks"][g]["kind"] for r in results if g in r["tasks"])
        keys = list(dict.fromkeys(k for r in results for k in r["tasks"].get(g, {}) if k != "kind"))
        rows = "".join(_row(k, direction(g, kind, k), [r["tasks"].get(g, {}).get(k) for r in results]) for k in keys)
        every.append(f'<table class="sum task"><tr class="group"><th colspan="{2 + len(results)}">{escape(g)} '
                     f'({kind})</th></tr><tr><th>figure</th><th>better</th>{runs}</tr>{rows}</table>')
    return (
        "<h2>Summary</h2><p class='note'>Published rows: official data, parakeet ASR. Run columns: "
        f"<b>{escape(score.LOCAL_NOTE)}</b>. ↑ higher is better, ↓ lower is better; the best run in bold.</p>"
        f'<table class="sum"><tr><th>v1.0 metric</th><th>better</th>{runs}{pubs}</tr>{"".join(official)}</table>'
        "<h3>Every figure of every task</h3><p class='note'>What the official scripts print and what they "
        "hide (raw latency, early speech, stop and response latency, kept talking; see bench/fdbench/README.md)."
        " Relevance and behaviour labels need an LLM judge: n/a offline.</p>"
        f'<div class="tasks">{"".join(every)}</div>'
    )


def _said(tl: Timeline, label: str) -> str:
    """What the run's assistant said: the scorer's ASR words, and the log's transcripts."""
    asr = " ".join(w for w, _, _ in tl.words) or ("(no words)" if tl.transcribed else "(not transcribed: the scorer "
                                                  "reads this task from the VAD only)")
    scope = " (after the interruption only, as the scorer transcribes it)" if tl.kind == "interruption" else ""
    out = [f"<div><b>{escape(label)}</b>, ASR{scope}: {escape(asr)}</div>"]
    for ev in tl.decisions or []:
        if not str(ev.get("text") or "").strip():
            continue
        if ev.get("type") == "response.output_audio_transcript.done":
            out.append(f"<div class='log'>{ev['t']:.2f} s, {escape(label)} said (log): {escape(str(ev['text']))}</div>")
        elif ev.get("type") == "conversation.item.input_audio_transcription.completed":
            out.append(f"<div class='log'>{ev['t']:.2f} s, {escape(label)} heard (log): "
                       f"{escape(str(ev['text']))}</div>")
    return "".join(out)


def card(timelines: list[Timeline], labels: list[str]) -> str:
    first = timelines[0]
    failing = [t for t in timelines if t.verdict != "pass"]
    verdicts = {t.verdict for t in timelines}
    badges = "".join(
        f'<span class="badge {t.verdict}">{escape(labels[t.run])}: {t.verdict.upper()}'
        f'{" — " + escape("; ".join(t.reasons)) if t.reasons else ""}</span>'
        for t in timelines
    )
    drawable = [t for t in timelines if t.verdict != "error" or t.duration > 0]
    body = svg.draw(drawable, labels) if drawable else ""
    said = "".join(_said(t, labels[t.run]) for t in timelines if t.verdict != "error")
    return (
        f'<section class="card" data-name="{escape(first.name)}" data-task="{escape(first.task)}" '
        f'data-verdict="{"fail" if failing else "pass"}" data-disagree="{int(len(verdicts) > 1)}" '
        f'data-runs="{",".join(str(t.run) for t in timelines)}">'
        f'<h3>{escape(first.name)} <small>{escape(first.kind)}, {first.duration:.1f} s</small></h3>'
        f'<div class="badges">{badges}</div>{body}'
        f'<div class="said"><div><b>user</b>: {escape(first.user_text) or "(no annotation)"}</div>{said}</div>'
        "</section>"
    )


def _cards(all_timelines: list[Timeline]) -> list[list[Timeline]]:
    """Runs on the same input share a card; failed first (most failing runs first), then by task."""
    cards: dict[tuple[str, str], list[Timeline]] = {}
    for tl in all_timelines:
        cards.setdefault((tl.name, tl.input_id), []).append(tl)

    def key(c: list[Timeline]) -> tuple[int, int, int, str]:
        folder = c[0].name.rsplit("/", 1)[-1]
        return (-sum(t.verdict != "pass" for t in c), _ORDER.get(c[0].task, 99),
                int(folder) if folder.isdigit() else 0, c[0].name)

    return sorted(cards.values(), key=key)


def _clean(value: Any) -> Any:
    """JSON for `JSON.parse`: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 24px;color:#222;max-width:1060px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:22px 0 6px}h3{font-size:14px;margin:4px 0}
.note{color:#555;font-size:12px;margin:2px 0 8px}table.sum{border-collapse:collapse;font-size:12px;margin-bottom:8px}
table.sum th,table.sum td{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}
table.sum th:first-child{text-align:left}td.dir{text-align:center!important;color:#06c;font-weight:bold}
td.best{font-weight:bold;background:#eaf6ea}td.pub,th.pub{color:#777;background:#fafafa}td.na{color:#999;font-style:italic}
tr.group th{background:#f1f3f6;text-align:left!important}
.tasks{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start}table.sum.task{margin:0}
.filters{position:sticky;top:0;background:#fff;padding:6px 0;border-bottom:1px solid #ddd;z-index:1}
.filters select,.filters label{margin-right:12px;font-size:13px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 10px;margin:10px 0}
.card[data-verdict=fail]{border-left:4px solid #c0392b}.card[data-verdict=pass]{border-left:4px solid #27ae60}
.badge{display:inline-block;font-size:12px;border-radius:3px;padding:1px 6px;margin:0 6px 4px 0}
.badge.fail{background:#fdecea;color:#a93226}.badge.pass{background:#eaf6ea;color:#1e8449}
.badge.error{background:#fff4e0;color:#935100}.said{font-size:12px;color:#333}.said .log{color:#6c3483}
svg.timeline{display:block;margin:4px 0;font-size:11px}
svg .lane-label{fill:#444}svg .lane-label.run{font-weight:bold}svg .tick{fill:#666;font-size:10px}
svg .user{fill:#3b6fb6}svg .asst{fill:#e08a2e}svg .asst.bc{fill:#f5c16c;stroke:#9a5b00;stroke-width:1}
svg .clean{fill:#f3c99a}svg .word{fill:#7a4a12}svg .axis{stroke:#999}
svg .mark line{stroke:#555;stroke-dasharray:4 3}svg .mark.region rect{fill:#f2e9c4;opacity:.55}
svg .mark-label{fill:#555;font-size:10px}
svg .span line{stroke:#1f4e79;stroke-width:2}svg .span circle{fill:#1f4e79}svg .span text{fill:#1f4e79}
svg .span.fail line{stroke:#c0392b}svg .span.fail circle{fill:#c0392b}svg .span.fail text{fill:#c0392b}
svg .heard{fill:#9db7dc}svg .ev.created{fill:#1e8449}svg .ev.done{fill:#777}svg .ev.cut{fill:#c0392b}
svg .ev.model{fill:#6c3483;font-size:10px}svg .ev.partial{fill:#3b6fb6}
svg .ev.error{fill:#c0392b}svg .ev.heard-text{fill:#3b6fb6}svg .ev.said-text{fill:#e08a2e}
"""

_JS = """
(function(){
  var data = JSON.parse(document.getElementById('fdb-data').textContent);
  var task = document.getElementById('f-task'), ver = document.getElementById('f-verdict');
  var dis = document.getElementById('f-disagree'), count = document.getElementById('f-count');
  function apply(){
    var cards = document.querySelectorAll('section.card'), shown = 0;
    for (var i = 0; i < cards.length; i++) {
      var c = cards[i];
      var ok = (!task.value || c.dataset.task === task.value) && (!ver.value || c.dataset.verdict === ver.value)
        && (!dis.checked || c.dataset.disagree === '1');
      c.hidden = !ok; if (ok) shown++;
    }
    count.textContent = shown + ' of ' + cards.length + ' samples shown (' + data.samples.length + ' sample runs)';
  }
  task.onchange = ver.onchange = dis.onchange = apply; apply();
})();
"""


def render(results: list[dict[str, Any]], timelines: list[Timeline]) -> str:
    """The page for scored runs (`score.score` results) and their timelines."""
    labels = [r["label"] for r in results]
    if len(set(labels)) < len(labels):  # two runs of one model: tell them apart by their folder
        labels = [f"{r['label']} ({Path(r['data']).name})" for r in results]
    runs = "".join(
        f"<li><b>{escape(label)}</b>: model {escape(str(r['run'].get('model')))}, pace "
        f"{escape(str(r['run'].get('pace')))}, {escape(r['data'])}, {sum(t['samples'] for t in r['tasks'].values())}"
        f" samples scored{', ' + str(len(r['errors'])) + ' NOT scored (listed first)' if r['errors'] else ''}</li>"
        for label, r in zip(labels, results, strict=True)
    )
    cards = _cards(timelines)
    tasks = sorted({t.task for t in timelines}, key=lambda g: _ORDER.get(g, 99))
    options = "".join(f'<option value="{escape(t)}">{escape(t)}</option>' for t in tasks)
    data = {"note": score.LOCAL_NOTE, "labels": labels,
            "runs": [{k: r[k] for k in ("label", "run", "data", "tasks", "errors")} for r in results],
            "samples": [asdict(t) for t in timelines]}
    blob = json.dumps(_clean(data), separators=(",", ":")).replace("</", "<\\/")
    failed = sum(1 for c in cards if any(t.verdict != "pass" for t in c))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>Full-Duplex-Bench report: {escape(', '.join(labels))}</title><style>{_CSS}</style></head><body>"
        f"<h1>Full-Duplex-Bench report</h1><p class='note'>{escape(score.LOCAL_NOTE)}. Written "
        f"{time.strftime('%Y-%m-%d %H:%M')} by <code>python -m bench.fdbench report</code>.</p><ul>{runs}</ul>"
        + summary(results, labels)
        + f"<h2>Samples</h2><p class='note'>{failed} of {len(cards)} samples failed in at least one run (the "
        "verdict is this report's reading of the scorer's figures: bench/fdbench/timeline.py). Lanes: the "
        "user's and the assistant's speech (Silero VAD, as the scorer), the ASR words as ticks, the scorer's "
        "measured spans (from the reference it measured from to the point it found), the server's log "
        "(heard: the user's speech as the model's VAD found it, | partial transcripts, • the final one; did: "
        "▶ response started, ■ done, red ■ cut short, ◆ the model's own events, named, • said). "
        "Hover for times.</p>"
        f'<div class="filters"><label>task <select id="f-task"><option value="">all</option>{options}</select>'
        '</label><label>verdict <select id="f-verdict"><option value="">all</option><option value="fail">'
        'failed in a run</option><option value="pass">passed in every run</option></select></label>'
        '<label><input type="checkbox" id="f-disagree"> runs disagree</label><span id="f-count"></span></div>'
        + "".join(card(c, labels) for c in cards)
        + f'<script type="application/json" id="fdb-data">{blob}</script><script>{_JS}</script></body></html>'
    )


def write(data_dirs: list[Path], out: Path, asr: str = "auto", gt: Path | None = None,
          progress: bool = True) -> dict[str, Any]:
    """Score every run, draw every sample, write the page; returns what it did (for the caller to print)."""
    started = time.monotonic()
    user_vad = UserVad()
    results: list[dict[str, Any]] = []
    timelines: list[Timeline] = []
    for i, data in enumerate(data_dirs):
        result = score.score(data, asr, gt, progress=progress)
        results.append(result)
        timelines.extend(run_timelines(i, find_samples(data), result, user_vad, progress))
    page = render(results, timelines)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return {"path": str(out), "bytes": len(page.encode("utf-8")), "samples": len(timelines),
            "seconds": round(time.monotonic() - started, 1), "results": results}
