"""The parallel suite's file order (tests/durations.py): longest first, tests inside a file as written,
and the figures read back from a junit report as pytest writes it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from tests import durations


@dataclass
class Item:  # what order() reads of a pytest item
    nodeid: str


def test_files_go_longest_first_and_unmeasured_ones_count_the_default() -> None:
    items = [Item(n) for n in ("a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "b.py::t2", "new.py::t1")]
    seconds = {"a.py": 3.0, "b.py": 40.0, "c.py": durations.DEFAULT_S + 1}
    durations.order(cast(Any, items), seconds)
    assert [i.nodeid for i in items] == ["b.py::t1", "b.py::t2", "c.py::t1", "new.py::t1", "a.py::t1", "a.py::t2"]


def test_a_junit_report_gives_each_files_seconds(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_layers" name="a" time="1.25"/>'
        '<testcase classname="tests.test_layers" name="b" time="0.5"/>'
        '<testcase classname="tests.test_durations.Nested" name="c" time="2.0"/>'
        '<testcase classname="tests.gone_module" name="d" time="9.0"/>'
        '<testcase classname="" name="tests.broken" time="1.0"/>'
        "</testsuite></testsuites>")
    assert durations.from_junit(report) == {"tests/test_durations.py": 2.0, "tests/test_layers.py": 1.8}
    out = tmp_path / "figures.json"
    out.write_text(json.dumps({"tests/x.py": 1}))
    assert durations.load(out) == {"tests/x.py": 1.0}
    assert durations.load(tmp_path / "missing.json") == {}
