"""How well do the words alone tell a finished turn from one cut by a pause? Two judges, one set.

    python -m bench.text_turn_judges [--json]

The set: everyday sentences of many kinds (questions, requests, statements, short answers), none of
them from the FD-bench generator's texts, each whole ("finished") and cut after every word from the
second to the last but one ("cut"). A cut can itself be a sentence ("Let's meet at the cafe | near the
station"): that is the real difficulty, so cuts are not filtered, and no judge can be perfect.

Judges: the word list of `models.turns.words.looks_complete` (a turn is finished unless its last word
needs a continuation), and the language model of `models.speech.text_turn` at several thresholds.
For each: the share of finished sentences it calls finished (their turns end at once) and the share
of cuts it calls finished (a pause the assistant may talk into), plus the model's cost per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from tqdm import tqdm

from models.speech.text_turn import TextTurn
from models.turns.words import looks_complete

SENTENCES = (
    "Can you tell me how to cook rice?",
    "I think that's a great idea.",
    "My flight leaves at seven tomorrow morning.",
    "How far is the moon from the earth?",
    "Thanks, that helps a lot.",
    "Could you recommend a good book about history?",
    "I don't really like spicy food.",
    "Why is the sky blue?",
    "Let's meet at the cafe near the station.",
    "She finally finished her thesis last week.",
    "What time is it in Tokyo right now?",
    "Please set a timer for ten minutes.",
    "I was wondering if you could help me with my homework.",
    "Yes, that's exactly what I meant.",
    "How do I get to the nearest pharmacy?",
    "The weather has been terrible all week.",
    "Tell me a joke.",
    "We should probably leave before the traffic gets bad.",
    "Is it going to rain this afternoon?",
    "My brother just bought a new car.",
    "Do you know any good restaurants around here?",
    "I need to renew my passport before the summer.",
    "Which one would you choose if you were me?",
    "The meeting got moved to Thursday afternoon.",
    "Remind me to call my mother tonight.",
    "No, I haven't seen that movie yet.",
    "What's the difference between a virus and a bacterium?",
    "Our team won the match on Saturday.",
    "How many cups are in a litre?",
    "I left my keys at the office again.",
    "Can you explain how a mortgage works?",
    "That sounds like a lot of fun.",
    "Where did you put the spare batteries?",
    "It took us three hours to get home.",
    "Should I bring anything to the party?",
    "The kids are finally asleep.",
    "Turn off the lights in the kitchen, please.",
    "I'm thinking about learning to play the piano.",
    "Who wrote the book you mentioned yesterday?",
    "We ran out of milk this morning.",
)
THRESHOLDS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)


def samples() -> tuple[list[str], list[str]]:
    """(finished sentences, cuts of them), as the user's words would be heard at a pause."""
    cuts = []
    for s in SENTENCES:
        words = s.split()
        cuts += [" ".join(words[:k]) for k in range(2, len(words))]
    return list(SENTENCES), cuts


def run() -> dict[str, object]:
    finished, cuts = samples()
    model = TextTurn(contexts=1)
    model.probability("warm up")
    p_fin: list[float] = []
    p_cut: list[float] = []
    cost: list[float] = []
    for text in tqdm(finished + cuts, desc="text_turn", unit="text", file=sys.stderr):
        t0 = time.perf_counter()
        p = model.probability(text)
        cost.append(time.perf_counter() - t0)
        (p_fin if text in SENTENCES else p_cut).append(p)
    judges: dict[str, dict[str, float]] = {
        "word list": {
            "finished_called_finished": sum(looks_complete(s.rstrip(".?!")) for s in finished) / len(finished),
            "cuts_called_finished": sum(looks_complete(c) for c in cuts) / len(cuts),
        }
    }
    for t in THRESHOLDS:
        judges[f"model p>={t}"] = {
            "finished_called_finished": sum(p >= t for p in p_fin) / len(p_fin),
            "cuts_called_finished": sum(p >= t for p in p_cut) / len(p_cut),
        }
    return {
        "finished": len(finished),
        "cuts": len(cuts),
        "judges": judges,
        "model_p_finished_median": statistics.median(p_fin),
        "model_p_cuts_median": statistics.median(p_cut),
        "model_ms_per_call_median": 1000 * statistics.median(cost),
        "model_ms_per_call_p90": 1000 * statistics.quantiles(cost, n=10)[-1],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.text_turn_judges", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    r = run()
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['finished']} finished sentences, {r['cuts']} cuts of them")
    print(f"{'judge':<16} {'finished -> finished':>21} {'cut -> finished':>16}")
    for name, j in r["judges"].items():  # type: ignore[attr-defined]
        print(f"{name:<16} {j['finished_called_finished']:>21.2f} {j['cuts_called_finished']:>16.2f}")
    print(
        f"model: median P {r['model_p_finished_median']:.3f} finished, {r['model_p_cuts_median']:.3f} cuts; "
        f"{r['model_ms_per_call_median']:.1f} ms per call (p90 {r['model_ms_per_call_p90']:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
