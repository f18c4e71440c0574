"""The background reasoner's context: append-only between requests (prefix-cache friendly), bounded."""

from __future__ import annotations

import itertools

from server.background_context import SYSTEM_PROMPT, ReasonerContext
from server.conversation import ConversationLog


def test_each_prompt_extends_the_previous_prompt_and_answer() -> None:
    log, ctx = ConversationLog(), ReasonerContext()
    log.add(0.2, "user", "what's the weather")
    first, pending = ctx.build(log, "be kind", "find the weather")
    assert first[0] == {"role": "system", "content": SYSTEM_PROMPT + "\n\nInstructions for this conversation: be kind"}
    assert first[1]["content"] == "Conversation so far:\nUser: what's the weather\n\nTask: find the weather"
    ctx.commit(pending, "It is sunny.")
    log.add(1.0, "background", "It is sunny.", kind="background")  # already in the context as an answer
    log.add(1.4, "user", "thanks", kind="typed")
    second, _ = ctx.build(log, "be kind", "anything else?")
    assert second[: len(first)] == first
    assert second[len(first)] == {"role": "assistant", "content": "It is sunny."}
    assert second[-1]["content"] == "Conversation so far:\nUser (typed): thanks\n\nTask: anything else?"


def test_a_failed_request_leaves_its_lines_for_the_next_one() -> None:
    log, ctx = ConversationLog(), ReasonerContext()
    log.add(0.0, "user", "hello")
    ctx.build(log, "", "q1")  # never committed: the request failed
    again, _ = ctx.build(log, "", "q2")
    assert "hello" in again[-1]["content"] and len(again) == 2


def test_context_stays_bounded_over_a_long_conversation() -> None:
    log, ctx = ConversationLog(), ReasonerContext(max_turns=8, max_chars=3000)
    for i in range(60):
        log.add(i * 1.0, "user" if i % 2 else "assistant", f"utterance {i} " + "blah " * 40)
        if i % 3 == 0:
            messages, pending = ctx.build(log, "", f"task {i}")
            ctx.commit(pending, "answer " * 30)
            chars = sum(len(m["content"]) for m in messages[1:])
            assert chars <= 3000 + 200, chars  # budget plus the short task line
            assert len(messages) <= 1 + 2 * 8 + 1


def test_a_question_the_user_asked_is_their_own_chat_turn() -> None:
    # The voice delegates what the user said; its acknowledgment carries nothing for the reasoner.
    log, ctx = ConversationLog(), ReasonerContext()
    log.add(3.6, "user", "how do i look after a goldfish")
    log.add(3.6, "assistant", "Okay. ")
    first, pending = ctx.build(log, "", "how do i look after a goldfish")
    assert first[1:] == [{"role": "user", "content": "how do i look after a goldfish"}]
    ctx.commit(pending, "Feed it a little every day.")
    # A backchannel and the next question merge into one speech entry: the turn is all of it, as said,
    # and matched however the query is cased or punctuated.
    log.add(6.0, "assistant", "Feed it a little every day.")
    log.add(8.0, "user", "mm-hm")
    log.add(9.0, "user", "and how often should i clean the tank")
    second, _ = ctx.build(log, "", "And how often should I clean the tank?")
    assert second[:3] == [*first, {"role": "assistant", "content": "Feed it a little every day."}]
    assert second[3:] == [{"role": "user", "content": "mm-hm and how often should i clean the tank"}]


def test_no_time_stamp_reaches_the_reasoner() -> None:
    # The same conversation logged a micro-turn later (a late transcript) is the same prompt.
    prompts = []
    for t in (3.6, 3.8):
        log = ConversationLog()
        log.add(t, "user", "tell me about the moon")
        log.add(t + 0.2, "assistant", "Sure.")
        messages, _ = ReasonerContext().build(log, "", "summarise the conversation")
        prompts.append(messages)
    assert prompts[0] == prompts[1]
    assert prompts[0][1]["content"] == (
        "Conversation so far:\nUser: tell me about the moon\nAssistant: Sure.\n\nTask: summarise the conversation")


def test_a_full_context_drops_to_half_so_the_next_requests_keep_their_prefix() -> None:
    # Each request past the budget used to drop one old turn: the prompt's start moved every time and
    # a prefix cache re-read the whole conversation on every request.
    log, ctx = ConversationLog(), ReasonerContext(max_turns=8, max_chars=100_000)
    prompts = []
    for i in range(24):
        log.add(float(i), "user", f"question {i}")
        messages, pending = ctx.build(log, "", f"question {i}")
        ctx.commit(pending, f"answer {i}")
        prompts.append(messages)
    misses = sum(1 for a, b in itertools.pairwise(prompts) if b[:len(a)] != a)
    # 24 requests with 8 turns kept: a drop to 4 turns every 5 requests, not one on each of the last 16
    assert 2 <= misses <= 5, misses
    assert all(len(m) <= 1 + 2 * 8 + 1 for m in prompts)
