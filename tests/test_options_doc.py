"""docs/options.md is generated from the code that declares the options; it must say what the code says."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from duplex import options_doc
from models.cascade.options import CascadeOptions
from models.moshi.options import MoshiOptions

ROOT = Path(__file__).resolve().parents[1]


def test_page_matches_the_code() -> None:
    assert options_doc.PAGE.read_text(encoding="utf-8") == options_doc.render(), (
        "docs/options.md differs from the options the code declares: python -m duplex.options_doc --write")


def test_every_option_has_an_entry_with_its_help_and_default() -> None:
    page = options_doc.render()
    for action in options_doc.serve_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        line = next(x for x in page.splitlines() if f'<a id="{options_doc.anchor(action)}"></a>' in x)
        assert all(f"`{name}`" in line for name in action.option_strings)
        help_text, _ = options_doc._help(action)
        assert help_text in line
    for cls, prefix in ((CascadeOptions, "cascade-"), (MoshiOptions, "moshi-")):
        for field in dataclasses.fields(cls):
            assert f'<a id="{prefix}{field.name}"></a>`{field.name}`' in page


def test_a_field_comment_reaches_the_page() -> None:
    docs = {d.name: d for d in options_doc.field_docs(MoshiOptions)}
    assert docs["greedy"].doc.startswith("argmax tokens")  # the comment beside the field
    assert "Fixed slots" in docs["slots"].doc  # the block just above it
    cascade = {d.name: d for d in options_doc.field_docs(CascadeOptions)}
    assert cascade["barge_in_ms"].see == "barge_in_pause_ms"  # no comment: the one that names it


def test_check_fails_on_a_stale_page_and_passes_once_written(tmp_path: Path) -> None:
    page = tmp_path / "options.md"
    page.write_text(options_doc.render().replace("TCP port", "UDP port"), encoding="utf-8")
    assert options_doc.main(["--check", "--page", str(page)]) == 1
    assert options_doc.main(["--write", "--page", str(page)]) == 0
    assert options_doc.main(["--check", "--page", str(page)]) == 0


def test_links_to_options_name_anchors_that_exist() -> None:
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', options_doc.render()))
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"options\.md#([\w-]+)", page.read_text(encoding="utf-8")):
            assert target in anchors, f"{page.name} links to options.md#{target}, which does not exist"
