"""`python -m bench.fdbench report --html` on a small real run, opened in a real headless Chromium.

One generated set of two samples: a turn-taking one (the echo answers before the user has finished:
a failure with a negative latency span) and a v1.5 user backchannel (the echo is silent when it
begins: a pass). The echo model runs both; the cascade, with a scripted OpenAI-compatible reasoner on
loopback (the network edge of this test), runs the turn-taking one only, which keeps it cheap and
puts two runs on one card. The page must load without console errors, list the failed sample first,
and draw every measured span where the scorer's own numbers put it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench.fdbench.__main__ import main
from bench.fdbench.generate import generate
from bench.fdbench.layout import find_samples, interruption_span, overlap_span, turn_end
from bench.fdbench.runner import run
from bench.fdbench.score import score
from tests.conftest import ARTIFACTS, start_server
from tests.server._background_stub import ScriptedOpenAI

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
playwright_sync = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium", allow_module_level=True)


def _runs(root: Path) -> tuple[Path, Path]:
    """The set run by echo (both samples) and by the cascade (the turn-taking sample)."""
    echo, cascade = root / "echo", root / "cascade"
    stub = ScriptedOpenAI().start()
    # asr=sphinx: the cascade's final transcripts from pocketsphinx, not Whisper, whose load took ~18 of
    # the ~24 s this server needed to start on a busy 2-core machine (5.7 s without it); what is drawn
    # here (speech, the server's log) does not depend on which ASR the reasoner hears. It is the slowest
    # part, so it starts first, while the set is generated and run by echo.
    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(start_server, "--model", "cascade:asr=sphinx", "--background", "openai",
                               "--background-url", stub.base_url, "--background-model", "scripted", tmp_path=root)
        try:
            generate(echo, samples=1, v15_samples=1, seed=5, tasks=("candor_turn_taking", "user_backchannel"))
            shutil.copytree(echo / "candor_turn_taking", cascade / "candor_turn_taking")
            srv = start_server("--model", "echo:0", tmp_path=root)
            try:
                assert not run(echo, srv.ws_url, pace="media").failed
            finally:
                srv.stop()
            srv = starting.result()
        except BaseException:
            with contextlib.suppress(Exception):
                starting.result().stop()
            stub.stop()
            raise
    try:
        assert not run(cascade, srv.ws_url, pace="media", timeout=60).failed
    finally:
        srv.stop()
        stub.stop()
    return echo, cascade


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("fdb_html")
    echo, cascade = _runs(root)
    out = root / "report.html"
    assert main(["report", str(echo), str(cascade), "--html", str(out)]) == 0
    return out, [echo, cascade]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    pw = playwright_sync.sync_playwright().start()
    b = pw.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync",
    ])
    try:
        yield b
    finally:
        b.close()
        pw.stop()


def _reference(kind: str, metric: str, sample: Any) -> float:
    """Where the scorer measures `metric` from (score.py), read with the scorer's own readers."""
    if kind == "turn_taking":
        return turn_end(sample)
    span = interruption_span(sample) if kind == "interruption" else overlap_span(sample)
    return span[0] if metric == "stop_latency" else span[1]


def test_report_opens_and_draws_the_scorers_spans(
    page_file: tuple[Path, list[Path]], browser: Any, tmp_path: Path
) -> None:
    out, runs = page_file
    html = out.read_text(encoding="utf-8")
    # Self-contained: nothing is fetched from anywhere.
    for needle in ("http://", "https://", "<link", "@import", "src="):
        assert needle not in html.replace('xmlns="http://www.w3.org/2000/svg"', ""), needle
    page = browser.new_page(viewport={"width": 1100, "height": 1600})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: errors.append(f"request {r.url}") if not r.url.startswith("file:") else None)
    page.goto(out.as_uri())
    assert page.locator("#f-count").text_content() == "2 of 2 samples shown (3 sample runs)"

    # 1. the summary names both runs beside the published rows, and the samples follow
    header = page.locator("table.sum").first.locator("tr").first.inner_text()
    assert "echo" in header and "cascade" in header and "Moshi" in header
    first = page.locator("section.card").first
    first.scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    for where in (tmp_path, ARTIFACTS):
        page.screenshot(path=str(where / "fdbench_report_top.png"))
        first.screenshot(path=str(where / "fdbench_report_timeline.png"))
    assert (tmp_path / "fdbench_report_timeline.png").stat().st_size > 10_000

    # 2. the failed sample is listed first; the passing one comes after it
    cards = page.locator("section.card")
    assert [cards.nth(i).get_attribute("data-verdict") for i in range(cards.count())] == ["fail", "pass"]
    assert first.get_attribute("data-name") == "candor_turn_taking/1"
    assert first.get_attribute("data-runs") == "0,1"  # echo and cascade on one card

    # 3. each span is where the scorer's numbers put it: in the page's data and in the drawing
    data = json.loads(page.locator("#fdb-data").text_content() or "")
    rows = [score(r, progress=False)["samples"]["candor_turn_taking/1"] for r in runs]  # once per run, not per span
    echo_row = rows[0]
    assert echo_row["raw_latency"] < 0  # the echo says the question back while it is being asked
    svg = first.locator("svg.timeline")
    x0, pps = float(svg.get_attribute("data-x0") or 0), float(svg.get_attribute("data-pps") or 0)
    spans = first.locator("g.span")
    assert spans.count() >= 1
    for i in range(spans.count()):
        g = spans.nth(i)
        run_i, metric = int(g.get_attribute("data-run") or -1), g.get_attribute("data-metric") or ""
        row = rows[run_i]
        sample = next(s for s in find_samples(runs[run_i]) if s.name == "candor_turn_taking/1")
        ref = _reference(sample.kind, metric, sample)
        start, end = float(g.get_attribute("data-start") or 0), float(g.get_attribute("data-end") or 0)
        assert start == pytest.approx(ref, abs=1e-3) and end - start == pytest.approx(row[metric], abs=1e-3)
        line = g.locator("line").first
        assert float(line.get_attribute("x1") or 0) == pytest.approx(x0 + start * pps, abs=0.1)
        assert float(line.get_attribute("x2") or 0) == pytest.approx(x0 + end * pps, abs=0.1)
        drawn = next(t for t in data["samples"] if t["run"] == run_i and t["name"] == "candor_turn_taking/1")
        assert drawn["scores"] == json.loads(json.dumps(row))
        assert any(s["metric"] == metric and s["end"] == pytest.approx(end, abs=1e-3) for s in drawn["spans"])
    echo_span = first.locator('g.span[data-run="0"][data-metric="raw_latency"]')
    assert float(echo_span.get_attribute("data-value") or 0) == pytest.approx(echo_row["raw_latency"], abs=1e-3)
    # The echo's onset is before the user's turn end: the span is drawn leftwards from it.
    line = echo_span.locator("line").first
    assert float(line.get_attribute("x2") or 0) < float(line.get_attribute("x1") or 0)

    # 4. the server's per-micro-turn log is drawn for both runs, and the filters work
    assert first.locator("g.ev.created").count() >= 2
    page.select_option("#f-verdict", "pass")
    assert page.locator("#f-count").text_content() == "1 of 2 samples shown (3 sample runs)"
    assert not cards.first.is_visible() and cards.nth(1).is_visible()
    page.select_option("#f-verdict", "")
    page.select_option("#f-task", "user_backchannel")
    assert cards.nth(1).is_visible() and not cards.first.is_visible()
    assert errors == []
    page.close()
