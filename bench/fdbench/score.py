"""`score`: every sample's figures, then per-task means, as one dict (the `--json` object).

A sample whose files are missing or malformed is reported under `errors` with what is wrong and is
left out of the means; every other sample is still scored.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.fdbench import align, metrics
from bench.fdbench.layout import (
    RUN_INFO,
    Sample,
    SampleError,
    find_gt_distribution,
    find_samples,
    gt_for,
    interruption_span,
    overlap_span,
    turn_end,
)

NOT_OFFLINE = "not available offline (needs an LLM judge)"
LOCAL_NOTE = "LOCAL SYNTHETIC DATA (offline ASR); not comparable to leaderboard numbers"


def _pause(sample: Sample, ctx: dict[str, Any]) -> dict[str, Any]:
    words = align.output_words(sample, asr=ctx["asr"])
    return {"tor": metrics.takeover(words), "words": len(words)}


def _turn_taking(sample: Sample, ctx: dict[str, Any]) -> dict[str, Any]:
    end = turn_end(sample)
    words = align.output_words(sample, asr=ctx["asr"])
    raw = metrics.raw_latency(words, end)
    return {"tor": metrics.takeover(words), "latency": metrics.floored(raw), "raw_latency": raw}


def _interruption(sample: Sample, ctx: dict[str, Any]) -> dict[str, Any]:
    start, end = interruption_span(sample)
    words = align.output_words(sample, crop_from=end, asr=ctx["asr"])
    segments = metrics.talk_spans(align.speech_segments(align.read_output(sample)))
    raw = metrics.raw_latency(words, end)
    return {
        "tor": metrics.takeover(words),
        "latency": metrics.floored(raw),
        "stop_latency": metrics.stop_latency(segments, start),
        "speaking_at_interrupt": metrics.speaking_at(segments, start),
    }


def _backchannel(sample: Sample, ctx: dict[str, Any]) -> dict[str, Any]:
    gt_path = find_gt_distribution(sample, ctx["gt"])
    if gt_path not in ctx["gt_cache"]:
        try:
            ctx["gt_cache"][gt_path] = json.loads(Path(gt_path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise SampleError(sample, f"ground-truth file {gt_path} is unreadable ({e})") from None
    gt = gt_for(sample, ctx["gt_cache"][gt_path])
    audio = align.read_output(sample)
    words = align.output_words(sample, asr=ctx["asr"])
    result = metrics.backchannel(align.speech_segments(audio), words, len(audio) / align.RATE, gt)
    return {
        "tor": result.tor,
        "frequency": result.frequency,
        "jsd": result.jsd,
        "backchannels": len(result.backchannels),
    }


def _overlap(sample: Sample, ctx: dict[str, Any]) -> dict[str, Any]:
    start, end = overlap_span(sample)
    out: dict[str, Any] = {}
    segs: dict[str, list[tuple[float, float]]] = {}
    for wav, prefix in (("clean_output.wav", "clean_"), ("output.wav", "")):
        if prefix and not sample.file(wav).exists():
            continue  # clean_output is optional for scoring: it is only a baseline
        segments = segs[prefix] = metrics.talk_spans(align.speech_segments(align.read_output(sample, wav)))
        out[prefix + "stop_latency"] = metrics.stop_latency(segments, start)
        out[prefix + "response_latency"] = metrics.response_latency(segments, end)
        out[prefix + "speaking_at_overlap"] = metrics.speaking_at(segments, start)
        out[prefix + "kept_talking"] = metrics.kept_talking(segments, start, end)
    # Kept talking where the clean run was still talking at the overlap's end (what it could keep).
    out["kept_talking_vs_clean"] = metrics.kept_talking(segs[""], start, end, segs.get("clean_"))
    if sample.group == "user_interruption":
        # The official eval_user_interruption.py also scores v1.5 user interruptions (from
        # metadata.json): TOR and latency of the output after the overlap ends.
        words = align.output_words(sample, crop_from=end, asr=ctx["asr"])
        out["tor"] = metrics.takeover(words)
        out["latency"] = metrics.floored(metrics.raw_latency(words, end))
    return out


_SCORERS: dict[str, Callable[[Sample, dict[str, Any]], dict[str, Any]]] = {
    "pause": _pause,
    "turn_taking": _turn_taking,
    "interruption": _interruption,
    "backchannel": _backchannel,
    "overlap": _overlap,
}


def _rate(values: list[Any]) -> float | None:
    defined = [bool(v) for v in values if v is not None]
    return sum(defined) / len(defined) if defined else None


def summarise(kind: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-task means by the official definitions, plus the extra timing figures."""
    col: Callable[[str], list[Any]] = lambda key: [r.get(key) for r in rows]  # noqa: E731
    out: dict[str, Any] = {"samples": len(rows)}
    if kind == "pause":
        out["tor"] = metrics.mean(col("tor"))
    elif kind == "turn_taking":
        out["tor"] = metrics.mean(col("tor"))
        out["latency"] = metrics.mean(col("latency"))
        out["raw_latency"] = metrics.mean(col("raw_latency"))
        out["early_speech_rate"] = metrics.early_speech_rate(col("raw_latency"))
    elif kind == "interruption":
        out["tor"] = metrics.mean(col("tor"))
        out["latency"] = metrics.mean(col("latency"))
        out["stop_latency"] = metrics.mean(col("stop_latency"))
        out["speaking_at_interrupt_rate"] = _rate(col("speaking_at_interrupt"))
        out["relevance"] = NOT_OFFLINE
    elif kind == "backchannel":
        out["tor"] = metrics.mean(col("tor"))
        out["frequency"] = metrics.mean(col("frequency"))
        out["jsd"] = metrics.mean(col("jsd"))
    elif kind == "overlap":
        for key in ("stop_latency", "response_latency", "clean_stop_latency", "clean_response_latency"):
            out[key] = metrics.mean(col(key))
        out["speaking_at_overlap_rate"] = _rate(col("speaking_at_overlap"))
        out["kept_talking_rate"] = _rate(col("kept_talking"))  # of the samples speaking at the overlap
        # ... of those whose clean run was still speaking when the overlap ended
        out["kept_talking_vs_clean_rate"] = _rate(col("kept_talking_vs_clean"))
        if any("tor" in r for r in rows):
            out["tor"] = metrics.mean(col("tor"))
            out["latency"] = metrics.mean(col("latency"))
        out["behaviour"] = NOT_OFFLINE
    return out


def run_info(data: Path) -> dict[str, Any]:
    """The run.json `run` left at the data root (or a folder or two above a task folder), else {}."""
    for folder in (data, *data.parents[:2]):
        info = folder / RUN_INFO
        if info.exists():
            try:
                loaded = json.loads(info.read_text(encoding="utf-8"))
                return loaded if isinstance(loaded, dict) else {}
            except (OSError, json.JSONDecodeError):
                return {}
    return {}


def score(data: Path, asr: str = "auto", gt: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Score every sample under `data`; returns {"label", "note", "tasks", "samples", "errors"}."""
    if asr not in ("auto", "always", "never"):
        raise ValueError(f"--asr must be auto, always or never, got {asr!r}")
    samples = find_samples(Path(data))
    ctx: dict[str, Any] = {"asr": asr, "gt": gt, "gt_cache": {}}
    per_sample: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    groups: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for sample in tqdm(samples, desc="score", unit="sample", disable=not progress):
        scorer = _SCORERS.get(sample.kind)
        if scorer is None:
            errors[sample.name] = (
                f"{sample.path}: cannot tell the task (no pause.json, turn_taking.json, "
                "interrupt.json or metadata.json, and the folder above has no official task name)"
            )
            continue
        try:
            row = scorer(sample, ctx)
        except SampleError as e:
            errors[sample.name] = str(e)
            continue
        except Exception as e:  # one broken sample must not stop the others from being scored
            errors[sample.name] = f"{sample.path}: unexpected {type(e).__name__}: {e}"
            continue
        per_sample[sample.name] = row
        groups.setdefault(sample.group, (sample.kind, []))[1].append(row)
    if not samples:
        errors[str(data)] = f"{data}: no samples found; point --data at a folder made by `generate`"
    info = run_info(Path(data))
    tasks = {group: {"kind": kind, **summarise(kind, rows)} for group, (kind, rows) in sorted(groups.items())}
    return {
        "label": str(info.get("label") or Path(data).name),
        "run": {k: info.get(k) for k in ("model", "pace", "url", "seconds", "failed")},
        "data": str(data),
        "note": LOCAL_NOTE,
        "tasks": tasks,
        "samples": per_sample,
        "errors": errors,
    }
