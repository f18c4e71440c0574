"""Tools the background reasoner may call: built-ins that need no network, and client-declared ones.

Built-ins are bounded before they compute: every operator and function checks the size of its
arguments and of its result, so no call can run long (the worst case measured is well under a
millisecond). They still run off the event loop, on a small thread pool with a timeout, as a second
line of defence. A thread cannot be killed, and a single big-integer operation holds the GIL for its
whole duration, so the timeout alone would not protect the event loop: the bounds are what do.
Client tools are declared with `session.update` in the Realtime format and executed by the client
(server/background.py sends the call and waits for its `function_call_output`).
"""

from __future__ import annotations

import ast
import asyncio
import datetime as dt
import json
import math
import operator
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from models.background import ToolSpec

MAX_EXPRESSION_CHARS = 300
MAX_NODES = 200
MAX_RESULT_DIGITS = 400  # integers beyond this many digits are refused (2**10**9 must not eat the CPU)
MAX_INT_BITS = int(MAX_RESULT_DIGITS * 3.33)
MAX_FUNC_ARGS = 32  # min/max over at most this many values
MAX_ROUND_DIGITS = MAX_RESULT_DIGITS  # round(x, n): |n| beyond this would build 10**|n|
TOOL_TIMEOUT = 2.0  # s a built-in may take off the loop before it is reported as failed
MAX_TOOL_OUTPUT_CHARS = 8000  # a built-in's result text
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="duplex-tools")


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


def _round(x: Any, ndigits: Any = None) -> Any:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int) or abs(ndigits) > MAX_ROUND_DIGITS:
        # round(1, -10**399) would compute 10**(10**399): refuse before Python tries.
        raise ToolError(f"round's digits must be a whole number between -{MAX_ROUND_DIGITS} and {MAX_ROUND_DIGITS}")
    return round(x, ndigits)


# name -> (function, fewest arguments, most arguments)
_FUNCS: dict[str, tuple[Callable[..., Any], int, int]] = {
    "sqrt": (math.sqrt, 1, 1), "abs": (abs, 1, 1), "round": (_round, 1, 2), "min": (min, 1, MAX_FUNC_ARGS),
    "max": (max, 1, MAX_FUNC_ARGS), "exp": (math.exp, 1, 1), "log": (math.log, 1, 2), "log10": (math.log10, 1, 1),
    "sin": (math.sin, 1, 1), "cos": (math.cos, 1, 1), "tan": (math.tan, 1, 1), "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
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
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting beyond the parser
        raise ToolError(f"not an arithmetic expression: {type(exc).__name__}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError(f"expression has more than {MAX_NODES} parts; split it up")
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except (OverflowError, ValueError, TypeError, RecursionError) as exc:
        raise ToolError(f"cannot compute that: {exc}") from None
    return value


def _eval(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value, node)
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
        return _bounded(result, node)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and not node.keywords):
        fn, fewest, most = _FUNCS[node.func.id]
        if not fewest <= len(node.args) <= most:
            span = f"{fewest} to {most}" if most > fewest else f"{fewest}"
            raise ToolError(f"cannot compute {node.func.id}: it takes {span} argument(s), got {len(node.args)}")
        return _bounded(fn(*(_eval(a) for a in node.args)), node)
    raise ToolError(f"unsupported element {ast.unparse(node)!r}: only numbers, + - * / // % ** and "
                    f"{', '.join(sorted(_FUNCS))} are allowed")


def _bounded(value: Any, node: ast.expr) -> Any:
    """Every intermediate value is a real number of bounded size, so the next operation stays cheap."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError(f"{ast.unparse(node)} is not a number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError(f"{ast.unparse(node)[:60]} has more than {MAX_RESULT_DIGITS} digits")
    return value


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
    except RecursionError:
        return error_result(name, "arguments are nested too deeply")
    except ToolError as exc:
        return error_result(name, str(exc))


async def run_builtin_async(name: str, arguments: str, timeout: float = TOOL_TIMEOUT) -> ToolResult:
    """`run_builtin` off the event loop, with a timeout; its result text is bounded too."""
    loop = asyncio.get_running_loop()
    try:
        result = await asyncio.wait_for(loop.run_in_executor(_POOL, run_builtin, name, arguments), timeout)
    except TimeoutError:
        return error_result(name, f"took longer than {timeout:g} s and was abandoned")
    if len(result.output) > MAX_TOOL_OUTPUT_CHARS:
        return error_result(name, f"result is over {MAX_TOOL_OUTPUT_CHARS} characters")
    return result


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
