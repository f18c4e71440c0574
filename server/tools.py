"""Tools the background reasoner may call: built-ins that need no network, and client-declared ones.

Built-ins run here, in microseconds (bounded inputs), so they run inline on the event loop. Client
tools are declared with `session.update` in the Realtime format and executed by the client
(server/background.py sends the call and waits for its `function_call_output`).
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from models.background import ToolSpec

MAX_EXPRESSION_CHARS = 300
MAX_NODES = 200
MAX_RESULT_DIGITS = 400  # integers beyond this many digits are refused (2**10**9 must not eat the CPU)


class ToolError(Exception):
    """A tool could not run on these arguments; the message goes back to the model as the result."""


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the model reads back (JSON text)
    ok: bool  # False: an error result (the conversation goes on)


# -- calculate ---------------------------------------------------------------------------------

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max, "exp": math.exp,
    "log": math.log, "log10": math.log10, "sin": math.sin, "cos": math.cos, "tan": math.tan,
    "floor": math.floor, "ceil": math.ceil,
}
_CONSTS = {"pi": math.pi, "e": math.e}


def calculate(expression: str) -> int | float:
    """Evaluate arithmetic by walking its syntax tree: numbers, + - * / // % **, a few math functions.

    Never `eval`: names, attributes, calls other than the listed functions and every other node type
    are refused, and sizes are bounded so no input can stall the event loop.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"not an arithmetic expression: {exc.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError(f"expression has more than {MAX_NODES} parts; split it up")
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except (OverflowError, ValueError, TypeError) as exc:
        raise ToolError(f"cannot compute that: {exc}") from None
    return value


def _eval(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        result = _BINOPS[type(node.op)](left, right)
        if isinstance(result, complex):
            raise ToolError(f"{ast.unparse(node)} has no real value")
        if isinstance(result, int) and result.bit_length() > MAX_RESULT_DIGITS * 3.33:
            raise ToolError(f"result has more than {MAX_RESULT_DIGITS} digits")
        return result
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and not node.keywords):
        return _FUNCS[node.func.id](*(_eval(a) for a in node.args))
    raise ToolError(f"unsupported element {ast.unparse(node)!r}: only numbers, + - * / // % ** and "
                    f"{', '.join(sorted(_FUNCS))} are allowed")


def _check_power(base: Any, exponent: Any) -> None:
    # Estimate the result's size before computing it: digits ≈ exponent * log10(|base|).
    if abs(exponent) > 10_000:
        raise ToolError(f"exponent {exponent} is too large")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > MAX_RESULT_DIGITS:
        raise ToolError(f"result would have more than {MAX_RESULT_DIGITS} digits")


# -- current time ------------------------------------------------------------------------------

def current_time(utc_offset_hours: float | None = None) -> dict[str, str]:
    now = dt.datetime.now(dt.UTC)
    if utc_offset_hours is not None:
        if not -14 <= utc_offset_hours <= 14:
            raise ToolError(f"utc_offset_hours must be between -14 and 14, got {utc_offset_hours}")
        now = now.astimezone(dt.timezone(dt.timedelta(hours=utc_offset_hours)))
    else:
        now = now.astimezone()  # the server's local zone
    return {"iso": now.isoformat(timespec="seconds"), "weekday": now.strftime("%A"),
            "spoken": now.strftime("%H:%M on %A, %d %B %Y")}


# -- registry ------------------------------------------------------------------------------------

BUILTIN_TOOLS: list[ToolSpec] = [
    {"type": "function", "function": {
        "name": "get_current_time",
        "description": "The current date and time (server clock).",
        "parameters": {"type": "object", "properties": {
            "utc_offset_hours": {"type": "number", "description": "time zone as hours from UTC; "
                                 "omit for the server's zone"}}}}},
    {"type": "function", "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression exactly, e.g. '17 * 23 + 4' or 'sqrt(2) / 3'.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
]
BUILTIN_NAMES = frozenset(t["function"]["name"] for t in BUILTIN_TOOLS)


def run_builtin(name: str, arguments: str) -> ToolResult:
    """Run a built-in tool; every failure becomes an error result, never an exception."""
    try:
        args = json.loads(arguments or "{}")
        if not isinstance(args, dict):
            raise ToolError("arguments must be a JSON object")
        if name == "calculate":
            expr = args.get("expression")
            if not isinstance(expr, str):
                raise ToolError("'expression' (a string) is required")
            return ToolResult(json.dumps({"result": calculate(expr)}), ok=True)
        if name == "get_current_time":
            offset = args.get("utc_offset_hours")
            if offset is not None and not isinstance(offset, int | float):
                raise ToolError("'utc_offset_hours' must be a number")
            return ToolResult(json.dumps(current_time(offset)), ok=True)
        raise ToolError(f"unknown built-in tool {name!r}")
    except json.JSONDecodeError as exc:
        return error_result(name, f"arguments are not valid JSON ({exc.msg})")
    except ToolError as exc:
        return error_result(name, str(exc))


def error_result(name: str, message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": f"tool {name} failed: {message}"}), ok=False)


def client_tools_to_chat(tools: list[dict[str, Any]]) -> list[ToolSpec]:
    """Realtime-format tools ({type, name, description, parameters}) -> chat-completions format."""
    out: list[ToolSpec] = []
    for t in tools:
        if t.get("type", "function") != "function" or not isinstance(t.get("name"), str):
            continue
        fn: dict[str, Any] = {"name": t["name"], "description": t.get("description", ""),
                              "parameters": t.get("parameters") or {"type": "object", "properties": {}}}
        out.append({"type": "function", "function": fn})
    return out
