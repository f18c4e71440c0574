"""The reasoner's context over hours: the prompt stays bounded, the oldest turns become a running summary in
the stable prefix, and the facts the user stated stay, verbatim, in what the reasoner is given."""

from __future__ import annotations

import itertools

from server.background_context import ReasonerContext
from server.context_summary import user_facts
from server.conversation import ConversationLog

FACTS = ["My name is Ingrid Halvorsen.", "My locker number is 4471.", "I prefer green tea to coffee."]
TOPICS = ["the weather in spring", "how bread rises", "why the sky is blue", "the rules of chess",
          "how trains brake", "what owls eat", "the history of maps", "how tides work"]


def _conversation(ctx: ReasonerContext, minutes: int) -> list[list[dict[str, str]]]:
    """A synthetic conversation: facts in the first minute, then a question and its answer every ~20 s."""
    log, prompts = ConversationLog(), []
    t = 0.0
    for fact in FACTS:
        log.add(t, "user", fact)
        log.add(t + 2, "assistant", "Got it.")
        t += 5
    for i in itertools.count():
        if t > minutes * 60:
            break
        question = f"tell me about {TOPICS[i % len(TOPICS)]}, part {i}"
        log.add(t, "user", question + ". " + "I was wondering about it on the way here " * 3)
        messages, pending = ctx.build(log, "be brief", question)
        prompts.append(messages)
        answer = f"Here is something about {TOPICS[i % len(TOPICS)]}. " + "It is a long story with details. " * 6
        ctx.commit(pending, answer)
        log.add(t + 4, "background", answer, kind="background")
        log.add(t + 5, "assistant", answer)
        t += 20
    return prompts


def test_two_hours_keep_the_prompt_bounded_and_every_planted_fact() -> None:
    ctx = ReasonerContext()
    prompts = _conversation(ctx, 120)
    sizes = [sum(len(m["content"]) for m in p) for p in prompts]
    assert len(prompts) > 300
    # Bounded: no growth once the budget is reached (the last hour's largest is no larger than the first's).
    first_hour, last_hour = sizes[: len(sizes) // 2], sizes[len(sizes) // 2 :]
    assert max(last_hour) <= max(first_hour) + 200, (max(first_hour), max(last_hour))
    assert max(sizes) < ctx.max_chars * 2
    last = prompts[-1]
    given = "\n".join(m["content"] for m in last)
    for fact in FACTS:
        assert fact in given, fact  # verbatim
    assert "Earlier in this conversation" in last[0]["content"]  # the running summary, in the prefix
    usage = ctx.usage()
    assert int(str(usage["summarised_turns"])) > 300 and int(str(usage["notes"])) >= len(FACTS)
    assert 0 < float(str(usage["usage_ratio"])) <= 1


def test_the_summary_changes_only_when_turns_are_folded() -> None:
    # The summary and the notes are the stable prefix: between two folds every prompt extends the previous.
    ctx = ReasonerContext(max_turns=8)
    prompts = _conversation(ctx, 30)
    misses = sum(1 for a, b in itertools.pairwise(prompts) if b[: len(a)] != a)
    assert misses <= len(prompts) // 4 + 1, (misses, len(prompts))


def test_user_facts_are_names_numbers_and_preferences_and_nothing_else() -> None:
    assert user_facts("Hello there. My name is Ingrid. How are you?") == ["My name is Ingrid."]
    assert user_facts("my flat is on floor twelve") == ["my flat is on floor twelve"]
    assert user_facts("I really like sailing. what time is it") == ["I really like sailing."]
    assert user_facts("what is the capital of France?") == []
