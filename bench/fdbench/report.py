"""Tables: our rows beside the published v1.0 rows (FDBENCH.md), plus the figures the official
scripts do not print. Every local row says it comes from local synthetic data."""

from typing import Any

# Published v1.0 results (Full-Duplex-Bench README, parakeet ASR), as in shared/FDBENCH.md.
PUBLISHED: list[tuple[str, tuple[float, ...]]] = [
    ("PersonaPlex", (0.584, 0.662, 0.992, 0.070, 1.000, 0.400, 0.025, 0.649)),
    ("Moshi", (0.985, 0.980, 0.941, 0.265, 1.000, 0.257, 0.001, 0.957)),
    ("Freeze-Omni", (0.642, 0.481, 0.336, 0.953, 0.867, 1.409, 0.001, 0.997)),
    ("Gemini Live 2.0", (0.255, 0.310, 0.655, 1.301, 0.891, 1.183, 0.012, 0.896)),
    ("GPT-Realtime", (0.010, 0.120, 1.000, 1.470, 0.970, 1.500, 0.007, 0.980)),
]
HEADERS = [
    "system",
    "pause TOR synth ↓",
    "pause TOR candor ↓",
    "turn TOR ↑",
    "turn lat s ↓",
    "interrupt TOR ↑",
    "interrupt lat s ↓",
    "bc freq ↑",
    "bc JSD ↓",
]
# (task folder, metric) per column, in HEADERS order after "system".
COLUMNS = [
    ("synthetic_pause_handling", "tor"),
    ("candor_pause_handling", "tor"),
    ("candor_turn_taking", "tor"),
    ("candor_turn_taking", "latency"),
    ("synthetic_user_interruption", "tor"),
    ("synthetic_user_interruption", "latency"),
    ("icc_backchannel", "frequency"),
    ("icc_backchannel", "jsd"),
]
EXTRA_HEADERS = [
    "system",
    "turn raw lat s",
    "early speech",
    "interrupt stop lat s",
    "speaking at interrupt",
    "relevance",
]
V15_HEADERS = [
    "system",
    "subset",
    "n",
    "stop lat s",
    "response lat s",
    "clean stop lat s",
    "clean response lat s",
    "TOR (interruption)",
    "lat s (interruption)",
    "speaking at overlap",
    "kept talking",
    "kept talking vs clean",
]


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def local_name(result: dict[str, Any]) -> str:
    return f"duplex {result['label']} [LOCAL SYNTHETIC DATA]"


def render(results: list[dict[str, Any]]) -> str:
    """The text report for one or more scored data dirs."""
    main_rows = [[name, *(_fmt(v) for v in values)] for name, values in PUBLISHED]
    extra_rows, v15_rows = [], []
    for res in results:
        tasks = res["tasks"]
        main_rows.append([local_name(res), *(_fmt(tasks.get(g, {}).get(m)) for g, m in COLUMNS)])
        tt, ui = tasks.get("candor_turn_taking", {}), tasks.get("synthetic_user_interruption", {})
        extra_rows.append(
            [
                local_name(res),
                _fmt(tt.get("raw_latency")),
                _fmt(tt.get("early_speech_rate")),
                _fmt(ui.get("stop_latency")),
                _fmt(ui.get("speaking_at_interrupt_rate")),
                "not available offline",
            ]
        )
        for group, summary in tasks.items():
            if summary.get("kind") == "overlap":
                v15_rows.append(
                    [
                        local_name(res),
                        group,
                        str(summary["samples"]),
                        *(
                            _fmt(summary.get(k))
                            for k in (
                                "stop_latency",
                                "response_latency",
                                "clean_stop_latency",
                                "clean_response_latency",
                                "tor",
                                "latency",
                                "speaking_at_overlap_rate",
                                "kept_talking_rate",
                                "kept_talking_vs_clean_rate",
                            )
                        ),
                    ]
                )
    parts = [
        "Full-Duplex-Bench v1.0 — published rows (official data, parakeet ASR) and LOCAL SYNTHETIC DATA rows",
        "(pocketsphinx ASR, synthetic TTS inputs). Local rows are not leaderboard numbers.",
        "",
        _table(HEADERS, main_rows),
        "",
        "Figures the official scripts hide (local rows only): raw turn latency (not floored at 0), share of",
        "turn-takings that start before the user finished, and how long the model keeps talking after an",
        "interruption starts (stop latency, Silero VAD). Relevance needs an LLM judge: not available",
        "offline.",
        "",
        _table(EXTRA_HEADERS, extra_rows),
    ]
    if v15_rows:
        parts += [
            "",
            "v1.5 overlap timing (Silero VAD; clean = same input without the overlap). "
            "Behaviour labels need an LLM judge: not available offline.",
            "kept talking (local figure): of the samples where the model was speaking when the overlap "
            "began, the share still speaking when it ended; vs clean: of those whose clean run (no overlap) "
            "was still speaking when it ended too (a reply that ended on its own was not cut off).",
            "",
            _table(V15_HEADERS, v15_rows),
        ]
    for res in results:
        counts = ", ".join(f"{g}: {s['samples']}" for g, s in res["tasks"].items())
        run = res.get("run") or {}
        how = f"model {run.get('model')}, pace {run.get('pace')}" if run.get("model") else "no run.json"
        parts += ["", f"{local_name(res)} from {res['data']} ({how}) — samples scored: {counts or 'none'}"]
        for name, why in res["errors"].items():
            parts.append(f"  NOT SCORED {name}: {why}")
    return "\n".join(parts)
