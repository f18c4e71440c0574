"""Declared tools for a small model: a routing step that picks the tool and its arguments before the
answer, instead of hoping the model writes a function call.

SmolLM2-135M does not choose between tools it is shown: asked for `{"tool": ..., "arguments": ...}`
under a JSON schema it named a tool near chance and called tools for questions none of them covers
(measured: docs/results/2026-12-07-declared-tool-routing.md). What it does well enough is copy a span
of the request into a slot when the choices are spelled out. So the step is split:
  1. which tool: the words of the request against each tool's declared words (its name, description,
     parameter names and descriptions), stemmed, without function words, each shared word weighted by
     how few of the declared tools use it; at least one must be of its name or description (a
     parameter's name alone says what it takes, not what it does). None: no tool (the reasoner
     answers). Several tools with the best score: the model picks among them under a JSON schema
     (`enum` of their names);
  2. its arguments: the model fills the tool's required parameters under a JSON schema whose string
     parameters are an `enum` of the phrases of the request (runs of up to four words, edges not
     function words or the tool's own words) and whose numbers are an `enum` of the numbers said in
     it (digits or number words): a value can only come from the user's words. A required parameter
     the request holds no candidate for: the call cannot be made, and `Route` says which one is
     missing. A single candidate is taken without asking the model.
What decides a tool is its declaration, never a list of words written for particular tools.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from models.background.base import Message, ToolChoice, ToolSpec


def _spaced(text: str) -> list[str]:
    return text.split()


# Function words and the light verbs every request uses ("can you get me..."): they say nothing about
# which tool is meant. A general English list, not one written for any tool.
STOPWORDS = frozenset(_spaced("""
a an the and or but if then so of to in on at by for from with about into over under up down out off
as is are was were be been being am do does did done doing have has had having will would can could
shall should may might must i me my mine we us our you your yours he him his she her it its they them
their this that these those there here what which who whom whose when where why how not no yes please
just some any all each every very too also much many more most other such only own same than now
get got set make made give gave tell told show find check want need like let know see go going put
s t d ll m re ve hey ok okay right thanks thank current"""))
MAX_SPAN_WORDS = 4  # a city, a name, an order number, a song title as said
MAX_CANDIDATES = 120  # phrases offered for one string parameter (a long request has many)
_NUMBER_WORDS = {w: i for i, w in enumerate(_spaced(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"))}
_TENS = {w: 10 * (i + 2) for i, w in enumerate(_spaced("twenty thirty forty fifty sixty seventy eighty ninety"))}

# (messages, JSON schema) -> the model's JSON text: a constrained, non-streamed completion.
CompleteJson = Callable[[list[Message], dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True)
class Route:
    """The routing step's decision for one request."""

    name: str | None  # the tool to call; None: no declared tool covers the request
    arguments: dict[str, Any] = field(default_factory=dict)
    missing: str | None = None  # a required parameter the request gives no value for (no call)
    asked_model: int = 0  # constrained completions it took (0: decided from the words alone)
    seconds: float = 0.0  # wall time the step took


def tool_name(tool: ToolSpec) -> str:
    return str(tool.get("function", {}).get("name", ""))


def spoken_name(name: str) -> str:
    """`get_weather` / `getWeather` -> "get weather"."""
    return " ".join(_split_identifier(name)).lower()


def _split_identifier(name: str) -> list[str]:
    return re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)


def stem(word: str) -> str:
    """A light suffix stripper (plural, -ing, -ed, -er, final e): "timers", "timer" and "time" meet."""
    w = word.lower().replace("'", "")
    changed = True
    while changed and len(w) > 3:
        changed = False
        for suffix in ("ies", "ing", "ed", "er", "es", "s", "e", "ly"):
            if w.endswith(suffix) and len(w) - len(suffix) >= 3:
                w = w[: -len(suffix)] + ("y" if suffix == "ies" else "")
                changed = True
                break
    return w


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9]+(?:['\-.][A-Za-z0-9]+)*", text)


def _function_word(word: str) -> bool:
    """A function word, contractions too ("what's", "i'd")."""
    return word.lower().split("'")[0] in STOPWORDS


def _content_stems(text: str) -> set[str]:
    out: set[str] = set()
    for w in _words(text):
        if _function_word(w):
            continue
        for part in _split_identifier(w) or [w]:
            if part.lower() not in STOPWORDS and not part.isdigit():
                out.add(stem(part))
    return out


def tool_terms(tool: ToolSpec) -> set[str]:
    """The stems a tool declares: its name, description, parameter names and their descriptions."""
    return purpose_terms(tool) | parameter_terms(tool)


def purpose_terms(tool: ToolSpec) -> set[str]:
    """The stems of what the tool does: its name and description."""
    fn = tool.get("function", {})
    return _content_stems(f"{str(fn.get('name', '')).replace('_', ' ')} {fn.get('description', '')}")


def parameter_terms(tool: ToolSpec) -> set[str]:
    """The stems of what it takes: parameter names and their descriptions."""
    parts = []
    for pname, prop in _properties(tool).items():
        parts.append(pname.replace("_", " "))
        if isinstance(prop, dict):
            parts.append(str(prop.get("description", "")))
    return _content_stems(" ".join(parts))


def lexical_scores(request: str, tools: list[ToolSpec]) -> dict[str, float]:
    """Each tool's share of the request's content words, a shared word weighing more the fewer tools
    declare it (inverse document frequency over the declared tools). A request that shares only
    parameter words with a tool scores 0 for it: "suggest a name for my puppy" is no call of
    `call_contact(name)`, "a busy city" no `get_weather(city)`; they add to a match on its purpose."""
    asked = _content_stems(request)
    purposes = {tool_name(t): purpose_terms(t) for t in tools}
    terms = {tool_name(t): purposes[tool_name(t)] | parameter_terms(t) for t in tools}
    n = len(terms)
    df: dict[str, int] = {}
    for ts in terms.values():
        for s in ts:
            df[s] = df.get(s, 0) + 1
    return {name: sum(math.log(1 + n / df[s]) for s in asked & ts) if asked & purposes[name] else 0.0
            for name, ts in terms.items()}


def _properties(tool: ToolSpec) -> dict[str, Any]:
    params = tool.get("function", {}).get("parameters") or {}
    props = params.get("properties") if isinstance(params, dict) else None
    return props if isinstance(props, dict) else {}


def _required(tool: ToolSpec) -> list[str]:
    params = tool.get("function", {}).get("parameters") or {}
    req = params.get("required") if isinstance(params, dict) else None
    props = _properties(tool)
    return [r for r in req if r in props] if isinstance(req, list) else []


def phrases(request: str, exclude: set[str]) -> list[str]:
    """Runs of up to MAX_SPAN_WORDS words of the request, as said, whose first and last words are
    neither function words nor `exclude` stems (the tool's own words: "email" in "email maria")."""
    words = _words(request)
    out: list[str] = []
    for i in range(len(words)):
        for j in range(i + 1, min(len(words), i + MAX_SPAN_WORDS) + 1):
            span = words[i:j]
            if any(_function_word(w) or stem(w) in exclude for w in (span[0], span[-1])):
                continue
            text = " ".join(span)
            if text not in out:
                out.append(text)
    return out[:MAX_CANDIDATES]


def numbers(request: str) -> list[int | float]:
    """The numbers said in the request: digits ("25", "2.5") and English number words up to 99."""
    out: list[int | float] = []
    words = [w.lower() for w in re.findall(r"[A-Za-z]+|\d+(?:\.\d+)?", request.replace("-", " "))]
    i = 0
    while i < len(words):
        w = words[i]
        value: int | float | None = None
        if w[0].isdigit():
            value = float(w) if "." in w else int(w)
        elif w in _TENS:
            value = _TENS[w]
            if i + 1 < len(words) and words[i + 1] in _NUMBER_WORDS and 0 < _NUMBER_WORDS[words[i + 1]] < 10:
                value += _NUMBER_WORDS[words[i + 1]]
                i += 1
        elif w in _NUMBER_WORDS:
            value = _NUMBER_WORDS[w]
        elif w in ("a", "an") and i + 1 < len(words) and words[i + 1] in ("hour", "minute", "second", "day"):
            value = 1
        if value is not None and value not in out:
            out.append(value)
        i += 1
    return out


def argument_schema(tool: ToolSpec, request: str) -> tuple[dict[str, Any], str | None]:
    """The JSON schema the arguments are decoded under (values from the request's words), and the
    first required parameter the request offers no value for (None when every one has candidates)."""
    own = tool_terms(tool)
    props: dict[str, Any] = {}
    for pname in _required(tool):
        prop = _properties(tool)[pname]
        kind = prop.get("type") if isinstance(prop, dict) else None
        if isinstance(prop, dict) and "enum" in prop:
            props[pname] = {"enum": prop["enum"]}
            continue
        if kind in ("integer", "number"):
            said = [v for v in numbers(request) if kind == "number" or isinstance(v, int)]
            choices: list[Any] = said
        elif kind == "boolean":
            choices = [True, False]
        else:  # a string (or an undeclared type): a phrase of the request
            choices = phrases(request, own)
        if not choices:
            return {}, pname
        props[pname] = {"enum": choices}
    schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    return schema, None


def _single_choices(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments when every parameter has exactly one candidate (no model needed)."""
    props = schema.get("properties", {})
    if all(len(p["enum"]) == 1 for p in props.values()):
        return {k: p["enum"][0] for k, p in props.items()}
    return None


def _listing(tools: list[ToolSpec]) -> str:
    lines = []
    for t in tools:
        fn = t.get("function", {})
        params = ", ".join(_properties(t))
        lines.append(f"- {fn.get('name')}({params}): {fn.get('description', '')}".rstrip(": "))
    return "\n".join(lines)


def choice_messages(request: str, tools: list[ToolSpec]) -> list[Message]:
    return [{"role": "system", "content": "Pick the tool that does what the user asks.\nTools:\n" + _listing(tools)},
            {"role": "user", "content": request}]


def argument_messages(request: str, tool: ToolSpec, parameter: str | None = None) -> list[Message]:
    what = f"the {parameter} argument" if parameter else "the arguments"
    return [{"role": "system", "content": f"Fill in {what} of this tool from the user's words.\nTool:\n"
             + _listing([tool])},
            {"role": "user", "content": request}]


def forced_name(tool_choice: ToolChoice) -> str | None:
    """The function a chat `tool_choice` names, if any."""
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool_choice.get("name")
        return name if isinstance(name, str) else None
    return None


async def route(request: str, tools: list[ToolSpec], tool_choice: ToolChoice,
                complete_json: CompleteJson) -> Route:
    """Which of `tools` the request asks for, with its arguments. `tool_choice` "required" always
    picks one (the best scored, or the model's pick when none scores); a named function is that one;
    "none" picks the tool without its arguments (no call will be made)."""
    start = time.perf_counter()
    asked = 0
    named = forced_name(tool_choice)
    candidates = [t for t in tools if tool_name(t) == named] if named else tools
    if not candidates:
        return Route(None, seconds=time.perf_counter() - start)
    scores = lexical_scores(request, candidates)
    best = max(scores.values())
    if best <= 0 and named is None and tool_choice != "required":
        return Route(None, seconds=time.perf_counter() - start)
    top = [t for t in candidates if scores[tool_name(t)] == best]
    if len(top) > 1:
        names = [tool_name(t) for t in top]
        text = await complete_json(choice_messages(request, top), {"enum": names})
        asked += 1
        picked = _json_value(text)
        top = [t for t in top if tool_name(t) == picked] or top[:1]
    tool = top[0]
    if tool_choice == "none":  # it will not be called: which tool is all the caller needs
        return Route(tool_name(tool), asked_model=asked, seconds=time.perf_counter() - start)
    schema, missing = argument_schema(tool, request)
    if missing is not None:
        return Route(tool_name(tool), missing=missing, asked_model=asked, seconds=time.perf_counter() - start)
    arguments = _single_choices(schema)
    props = schema["properties"]
    if arguments is None and len(props) == 1:
        # One parameter (the usual case): decode its value alone, not an object around it (fewer tokens).
        (pname, prop), = props.items()
        text = await complete_json(argument_messages(request, tool, pname), prop)
        asked += 1
        arguments = {pname: _json_value(text)}
    elif arguments is None:
        text = await complete_json(argument_messages(request, tool), schema)
        asked += 1
        arguments = _json_object(text)
    if arguments is not None and any(arguments.get(k) not in p["enum"] for k, p in props.items()):
        arguments = None
    if arguments is None:  # the server enforces the schema; a reply outside it means it did not
        arguments = {k: p["enum"][0] for k, p in props.items()}
    return Route(tool_name(tool), arguments, asked_model=asked, seconds=time.perf_counter() - start)


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# -- what is said instead of a made-up result ---------------------------------------------------------

MAX_SPOKEN_RESULT_CHARS = 400


def spoken_result(name: str, output: str) -> str:
    """A tool's output as the answer, word for word (its fields as "key value" pairs when it is JSON):
    nothing between the output and the voice can change a value."""
    try:
        value = json.loads(output)
    except ValueError:
        value = output
    if isinstance(value, dict) and isinstance(value.get("error"), str):
        return f"I couldn't {spoken_name(name)}: the tool reported an error."
    text = _spoken_value(value).strip()
    if not text:
        return f"{spoken_name(name).capitalize()} returned nothing."
    if len(text) > MAX_SPOKEN_RESULT_CHARS:
        text = text[:MAX_SPOKEN_RESULT_CHARS].rsplit(" ", 1)[0] + "..."
    return text if text[-1] in ".!?" else text + "."


def _spoken_value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{' '.join(_split_identifier(str(k))).lower()} {_spoken_value(v)}"
                         for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return ", ".join(_spoken_value(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def refusal(name: str) -> str:
    """The answer when the request needs a declared tool that may not be called (tool_choice none)."""
    return f"I can't do that here: the {spoken_name(name)} tool is turned off right now."


def missing_argument(name: str, parameter: str) -> str:
    """The answer when the request gives no value for a required parameter (no call is made)."""
    return f"To {spoken_name(name)} I need the {' '.join(_split_identifier(parameter)).lower()}; please say it."
