"""Build a reasoner from the server's settings (`--background`, `--background-url`, `--background-model`)."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass

from models.background.base import Reasoner

log = logging.getLogger(__name__)

KINDS = ("auto", "none", "llama-server", "llamacpp", "openai", "sglang")



@dataclass
class ReasonerSpec:
    kind: str = "auto"  # one of KINDS
    url: str | None = None  # openai: base URL
    model: str | None = None  # openai/sglang: model name or path; llamacpp: GGUF path
    max_tokens: int | None = None  # None = the backend's default
    max_sentences: int | None = None  # llamacpp: stop an answer after N sentences; None = its default, 0 = off
    threads: int = 1  # llama-server/llamacpp: compute threads (see llamacpp_backend's docstring)
    slots: int | None = None  # llama-server: conversations kept and answered at once; None = its default
    on_restart: Callable[[str], None] | None = None  # llama-server: told the reason of each crash (a metric)


def llamacpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def make_reasoner(spec: ReasonerSpec) -> Reasoner | None:
    """The configured reasoner, or None for `none` (and for `auto` when llama.cpp is not installed).

    `auto` prefers llama-server (built by `make setup`): it keeps every session's conversation evaluated
    and answers sessions together (bench/reasoner_concurrency.py: first speakable sentence p90 3.5 s
    against 12.2 s in process with 8 sessions asking at once, 2 cores); else the in-process llamacpp."""
    kind = spec.kind
    if kind not in KINDS:
        raise ValueError(f"unknown background reasoner {kind!r}; choose one of: {', '.join(KINDS)}")
    if kind == "auto" and llamacpp_available():
        from models.background.llama_server import binary_available

        if binary_available():
            kind = "llama-server"
            log.info("background reasoner: llama-server (auto: the llama-server binary was found)")
    if kind == "llama-server":
        from models.background.llama_server import LlamaServerConfig, LlamaServerReasoner

        lcfg = LlamaServerConfig(model_path=spec.model, threads=spec.threads, on_restart=spec.on_restart)
        if spec.slots:
            lcfg.parallel = spec.slots
        if spec.max_tokens:
            lcfg.max_tokens = spec.max_tokens
        if spec.max_sentences is not None:
            lcfg.max_sentences = spec.max_sentences
        return LlamaServerReasoner(lcfg)
    if kind == "auto":
        if not llamacpp_available():
            log.info("background reasoner: none (auto: llama-cpp-python is not installed; install it or "
                     "pass --background openai --background-url URL)")
            return None
        kind = "llamacpp"
        log.info("background reasoner: llamacpp (auto: llama-cpp-python found)")
    if kind == "none":
        return None
    if kind == "llamacpp":
        from models.background.llamacpp_backend import LlamaCppConfig, LlamaCppReasoner

        cfg = LlamaCppConfig(model_path=spec.model, n_threads=spec.threads)
        if spec.max_tokens:
            cfg.max_tokens = spec.max_tokens
        if spec.max_sentences is not None:
            cfg.max_sentences = spec.max_sentences
        return LlamaCppReasoner(cfg)
    if kind == "openai":
        from models.background.openai_backend import OpenAIConfig, OpenAIReasoner

        if not spec.url:
            raise ValueError("--background openai needs --background-url, the base URL of an "
                             "OpenAI-compatible server (e.g. http://127.0.0.1:30000/v1)")
        ocfg = OpenAIConfig(base_url=spec.url, model=spec.model or "default")
        if spec.max_tokens:
            ocfg.max_tokens = spec.max_tokens
        return OpenAIReasoner(ocfg)
    from models.background.sglang_backend import SGLangConfig, SGLangReasoner

    if not spec.model:
        raise ValueError("--background sglang needs --background-model, a model path or id already on disk")
    scfg = SGLangConfig(model_path=spec.model)
    if spec.max_tokens:
        scfg.max_tokens = spec.max_tokens
    return SGLangReasoner(scfg)
