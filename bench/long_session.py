"""An hours-long session with a scripted conversation: is what the server holds bounded, is its cost flat,
and is what the user said kept?

    python -m bench.long_session --minutes 30 --model cascade [--pace media|realtime] [--json out.json]

One session. The user states facts in the first minutes (typed: a name, a number, a preference), asks
the background reasoner a question every `--ask-every` seconds of the session's clock and, at the end,
asks for each fact. In between the microphone sends silence. Per 10 minutes of session time (`--window-minutes`): the
server's RSS, the micro-turn step time p50/p99, tick lateness p99 (real time), the reasoner's prompt
size per request and its context fill (from `duplex.session.usage`); at the end, how many planted
facts the answers got right.

`--reasoner recorder` serves the reasoner from this process: an OpenAI-compatible server that records
every prompt and answers a question about a fact from its context (the fact's line, when it is there),
so "is the fact still in what the reasoner is given" is measured directly, and prompt sizes are exact.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench._server import ServerUnderTest, free_port, histogram_quantile, scrape
from bench.fdbench.client import input_window_ticks
from bench.wsclient import open_session

TICK_S = 0.2
SILENCE = bytes(4800 * 2)  # one micro-turn of 24 kHz PCM16
EXTENSIONS = {"X-Duplex-Extensions": "1"}

# (what the user says, the question at the end, what a right answer contains)
FACTS = [
    ("My name is Ingrid Halvorsen.", "What is my name?", "ingrid"),
    ("My locker number is 4471.", "What is my locker number?", "4471"),
    ("I prefer green tea to coffee.", "What do I prefer to drink, tea or coffee?", "tea"),
    ("My daughter's name is Mathilde.", "What is my daughter's name?", "mathilde"),
]
TOPICS = ["how bread rises", "why the sky is blue", "the rules of chess", "how trains brake", "what owls eat",
          "the history of maps", "how tides work", "why leaves change colour", "how a bicycle stays up"]


@dataclass
class Window:
    start_min: int
    rss_mb: float | None = None
    step_p50_ms: float | None = None
    step_p99_ms: float | None = None
    late_p99_ms: float | None = None
    prompt_chars: list[int] = field(default_factory=list)
    usage_ratio: float | None = None
    summarised_turns: int | None = None


@dataclass
class Run:
    windows: list[Window] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)  # question -> answer
    requests: int = 0
    failed: int = 0
    closed: str | None = None


class _Recorder:
    """An OpenAI-compatible chat server that records prompts and answers from them (module docstring)."""

    def __init__(self) -> None:
        self.prompts: list[list[dict[str, str]]] = []
        self.port = free_port()

    def start(self) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        async def chat(request: Request) -> StreamingResponse:
            body = await request.json()
            messages = body.get("messages", [])
            self.prompts.append(messages)
            text = self.answer(messages)

            async def sse() -> Any:
                chunk = {"id": "r", "object": "chat.completion.chunk", "created": 0, "model": "recorder",
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                                      "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
                chunk["choices"] = [{"index": 0, "delta": {}, "finish_reason": "stop"}]
                yield f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")

        app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        threading.Thread(target=server.run, daemon=True, name="recorder").start()
        while not server.started:
            time.sleep(0.05)

    @staticmethod
    def answer(messages: list[dict[str, str]]) -> str:
        """The planted fact's line when the question asks for it and the prompt holds it; else a plain line."""
        question = messages[-1]["content"].lower() if messages else ""
        context = "\n".join(m.get("content", "") for m in messages[:-1]) + "\n" + question
        for said, asked, _ in FACTS:
            if asked.lower().rstrip("?") in question and said.lower() in context.lower():
                return said
        return "Here is a short answer."


async def _converse(url: str, minutes: float, ask_every: float, pace: str, run: Run, metrics_url: str,
                    pid: int, window_minutes: float = 10.0, verbose: bool = False) -> None:
    ws = await open_session(url, headers=EXTENSIONS)
    window_ticks = 6
    answered = -1  # newest micro-turn answered (media pace)
    asked: dict[str, str] = {}  # request id -> question
    pending: set[str] = set()  # questions asked and not answered
    usage: dict[str, Any] = {}
    done = asyncio.Event()

    async def receive() -> None:
        nonlocal answered, window_ticks
        async for raw in ws:
            if isinstance(raw, bytes):
                continue
            ev = json.loads(raw)
            kind = ev.get("type")
            if verbose and str(kind).startswith(("duplex.background.started", "duplex.background.done",
                                                 "duplex.background.error", "error")):
                print(f"[tick {answered}] {str(ev)[:240]}", file=sys.stderr, flush=True)
            if kind == "response.output_audio.delta" and isinstance(ev.get("tick"), int):
                answered = max(answered, ev["tick"])
            elif kind == "duplex.input.window":
                window_ticks = input_window_ticks(ev)
            elif kind == "duplex.background.started":
                asked[ev.get("request_id", "")] = str(ev.get("query", ""))
            elif kind == "duplex.background.done":
                question = asked.get(ev.get("request_id", ""), "")
                run.requests += 1
                if ev.get("status") != "completed":
                    run.failed += 1
                if question in pending:
                    run.answers[question] = str(ev.get("text", ""))
                    pending.discard(question)
            elif kind == "duplex.background.error":
                run.failed += 1
            elif kind == "error" and (ev.get("error") or {}).get("code") == "rate_limited":
                # The server limits a client's requests in wall time: ask again when it says.
                m = re.search(r"in (\d+) s", str(ev["error"].get("message", "")))
                retry_at[0] = time.monotonic() + (int(m.group(1)) if m else 5)
                if last_asked:
                    to_ask.insert(0, last_asked[0])
            elif kind == "duplex.session.usage":
                usage.update(ev.get("reasoner_context") or {})
                if usage.get("prompt_chars") and run.windows:
                    run.windows[-1].prompt_chars.append(int(usage["prompt_chars"]))
            elif kind == "duplex.session.closing":
                run.closed = f"{ev.get('code')} {ev.get('reason')}"
        done.set()

    async def send(event: dict[str, Any]) -> None:
        await ws.send(json.dumps(event))

    to_ask: list[str] = []  # questions due, asked one at a time as the server's rate limit allows
    last_asked: list[str] = []
    retry_at = [0.0]

    async def ask_due() -> None:
        """Ask what is due, one at a time; the session's clock waits while the server's rate limit (wall
        time) holds a question back, so the script keeps its timing on the session's clock."""
        while to_ask and not receiver.done():
            if time.monotonic() < retry_at[0]:
                await asyncio.sleep(0.05)
                continue
            question = to_ask.pop(0)
            pending.add(question)
            last_asked[:] = [question]
            await send({"type": "duplex.background.request", "query": question, "policy": "queue"})
            await asyncio.sleep(0.2)  # a refusal (rate_limited) puts it back in `to_ask` meanwhile

    receiver = asyncio.create_task(receive())
    await send({"type": "session.update", "session": {"pace": pace}})
    await asyncio.sleep(0.5)
    n_ticks = int(minutes * 60 / TICK_S)
    fact_at = {int((20 + 25 * i) / TICK_S): said for i, (said, _, _) in enumerate(FACTS)}
    ask_ticks = max(1, int(ask_every / TICK_S))
    recall_from = n_ticks - int(60 / TICK_S)  # the last minute asks for the facts
    recall_at = {recall_from + int(12 / TICK_S) * i: asked_q for i, (_, asked_q, _) in enumerate(FACTS)}
    before = scrape(metrics_url)
    window = Window(0)
    run.windows.append(window)
    t0 = time.monotonic()
    tick = 0
    while tick < n_ticks or ((pending or to_ask) and tick < n_ticks + int(120 / TICK_S)):
        if receiver.done():
            break
        if tick in fact_at:
            await send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": fact_at[tick]}]}})
        elif tick in recall_at:
            to_ask.append(recall_at[tick])
        elif tick % ask_ticks == ask_ticks // 2 and tick < recall_from:
            to_ask.append(f"Tell me briefly about {TOPICS[(tick // ask_ticks) % len(TOPICS)]}.")
        await ask_due()
        if pace == "media":
            while tick - answered > window_ticks and not receiver.done():
                await asyncio.sleep(0.002)
        else:
            delay = t0 + tick * TICK_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await ws.send(SILENCE)
        tick += 1
        if tick % int(window_minutes * 60 / TICK_S) == 0:  # every window of session time
            after = scrape(metrics_url)
            _close_window(window, before, after, usage, pid)
            print(_line(window), file=sys.stderr, flush=True)
            before, window = after, Window(int(tick * TICK_S // 60))
            run.windows.append(window)
    _close_window(window, before, scrape(metrics_url), usage, pid)
    await ws.close()
    receiver.cancel()
    await asyncio.gather(receiver, return_exceptions=True)


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        return None
    m = re.search(r"^VmRSS:\s+(\d+)", status, re.MULTILINE)
    return int(m.group(1)) / 1024 if m else None


def _close_window(w: Window, before: dict[str, float], after: dict[str, float], usage: dict[str, Any],
                  pid: int) -> None:
    w.rss_mb = _rss_mb(pid)
    for attr, name, q in (("step_p50_ms", "duplex_tick_step_seconds", 0.5),
                          ("step_p99_ms", "duplex_tick_step_seconds", 0.99),
                          ("late_p99_ms", "duplex_tick_lateness_seconds", 0.99)):
        v = histogram_quantile(before, after, name, q)
        setattr(w, attr, round(v * 1000, 2) if v is not None else None)
    w.usage_ratio = usage.get("usage_ratio")
    w.summarised_turns = usage.get("summarised_turns")


def _line(w: Window) -> str:
    prompt = f"{max(w.prompt_chars)}" if w.prompt_chars else "-"
    return (f"min {w.start_min:>4}: rss {w.rss_mb or 0:.0f} MB  step p50 {w.step_p50_ms} ms p99 {w.step_p99_ms} ms"
            f"  late p99 {w.late_p99_ms} ms  prompt chars max {prompt}  fill {w.usage_ratio}"
            f"  summarised {w.summarised_turns}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="session time of the conversation")
    ap.add_argument("--model", default="cascade")
    ap.add_argument("--pace", choices=["media", "realtime"], default="media")
    ap.add_argument("--reasoner", choices=["server", "recorder"], default="server",
                    help="server: the server's own (--background auto); recorder: module docstring")
    ap.add_argument("--ask-every", type=float, default=60.0, help="seconds of session time between questions")
    ap.add_argument("--window-minutes", type=float, default=10.0, help="session minutes per row of figures")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--verbose", action="store_true", help="print the reasoner's events as they come")
    args = ap.parse_args(argv)
    # One session: a fixed capacity skips the start-up calibration (minutes on a loaded machine).
    server_args = ["--model", args.model, "--log-level", "warning", "--session-usage-every", "1",
                   "--max-sessions", "2"]
    recorder = None
    if args.reasoner == "recorder":
        recorder = _Recorder()
        recorder.start()
        server_args += ["--background", "openai", "--background-url", f"http://127.0.0.1:{recorder.port}/v1",
                        "--background-model", "recorder"]
    run = Run()
    started = time.monotonic()
    with ServerUnderTest(*server_args, ready_timeout=900) as server:
        asyncio.run(_converse(server.ws_url, args.minutes, args.ask_every, args.pace, run, server.url, server.pid,
                              args.window_minutes, args.verbose))
    right = sum(1 for _, q, want in FACTS if want in run.answers.get(q, "").lower())
    out: dict[str, Any] = {
        "model": args.model, "pace": args.pace, "minutes": args.minutes, "reasoner": args.reasoner,
        "wall_s": round(time.monotonic() - started, 1), "requests": run.requests, "failed": run.failed,
        "closed": run.closed, "facts_answered_right": f"{right}/{len(FACTS)}", "answers": run.answers,
        "windows": [w.__dict__ for w in run.windows],
    }
    if recorder is not None and recorder.prompts:
        sizes = [sum(len(m.get("content", "")) for m in p) for p in recorder.prompts]
        last = "\n".join(m.get("content", "") for m in recorder.prompts[-1])
        out["prompt_chars"] = {"first_10": sizes[:10], "last_10": sizes[-10:], "max": max(sizes),
                               "median": statistics.median(sizes)}
        out["facts_in_last_prompt"] = f"{sum(1 for said, _, _ in FACTS if said in last)}/{len(FACTS)}"
    for w in run.windows:
        print(_line(w))
    summary = {k: v for k, v in out.items() if k != "windows"}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if run.closed is None or not re.match(r"^1011", run.closed) else 1


if __name__ == "__main__":
    sys.exit(main())
