"""Built-in background tools: safe arithmetic (no eval) and the current time."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from server.tools import ToolError, calculate, client_tools_to_chat, run_builtin, run_builtin_async


@pytest.mark.parametrize(("expr", "value"), [("17 * 23 + 1", 392), ("2 ** 10", 1024), ("7 // 2", 3), ("7 % 4", 3),
                                             ("-(3 - 5) * 1.5", 3.0), ("sqrt(16) + abs(-2)", 6.0), ("2^3", 8),
                                             ("round(pi, 2)", 3.14), ("max(1, 5, 3)", 5)])
def test_calculate(expr: str, value: float) -> None:
    assert calculate(expr) == value


@pytest.mark.parametrize(("expr", "why"), [
    ("__import__('os').system('true')", "unsupported element"), ("open('/etc/passwd')", "unsupported element"),
    ("(1).__class__", "unsupported element"), ("x + 1", "unsupported element"), ("1 / 0", "division by zero"),
    ("9 ** 9 ** 9", "exponent"), ("2 ** 5000", "digits"), ("10 ** 100000", "exponent"),
    ("(-8) ** 0.5", "no real value"),
    ("1 +", "not an arithmetic expression"), ("1" * 400, "characters"), ("True + 1", "unsupported element"),
    ("sqrt(-1)", "cannot compute"), ("min()", "cannot compute"),
])
def test_calculate_refuses_what_is_not_bounded_arithmetic(expr: str, why: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(ToolError, match=why):
        calculate(expr)
    assert time.perf_counter() - t0 < 0.05, "a refused expression must not be computed first"


def test_run_builtin_turns_every_failure_into_an_error_result() -> None:
    ok = run_builtin("calculate", '{"expression": "6 * 7"}')
    assert ok.ok and json.loads(ok.output) == {"result": 42}
    for name, args in [("calculate", "{not json"), ("calculate", "[]"), ("calculate", '{"expression": 5}'),
                       ("get_current_time", '{"utc_offset_hours": 99}'), ("nope", "{}")]:
        res = run_builtin(name, args)
        assert not res.ok and json.loads(res.output)["error"].startswith(f"tool {name} failed:")


def test_current_time_in_a_given_zone() -> None:
    res = run_builtin("get_current_time", '{"utc_offset_hours": 5.5}')
    now = dt.datetime.fromisoformat(json.loads(res.output)["iso"])
    assert now.utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert abs((now - dt.datetime.now(dt.UTC)).total_seconds()) < 5


def test_client_tools_convert_from_realtime_to_chat_format() -> None:
    tools = client_tools_to_chat([{"type": "function", "name": "f", "description": "d",
                                   "parameters": {"type": "object"}}, {"type": "other", "name": "skip"}])
    assert tools == [{"type": "function", "function": {"name": "f", "description": "d",
                                                       "parameters": {"type": "object"}}}]


async def test_builtins_run_off_the_event_loop_with_bounded_output() -> None:
    ok = await run_builtin_async("calculate", '{"expression": "2 ** 10"}')
    assert ok.ok and json.loads(ok.output) == {"result": 1024}
    bomb = await run_builtin_async("calculate", '{"expression": "round(1, -10**399)"}')
    assert not bomb.ok and "round's digits" in bomb.output
    deep = await run_builtin_async("calculate", "[" * 100_000)
    assert not deep.ok and "nested too deeply" in deep.output
