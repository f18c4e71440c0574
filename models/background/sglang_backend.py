"""SGLang's in-process engine, for a machine with a GPU and `sglang` installed.

The engine runs its scheduler and GPU workers in their own processes, so generation never touches the
event loop; `async_generate(stream=True)` is awaited directly.

One GPU box and nothing else wants the GPU's memory? Use this backend. Several GPUs or nodes, or a
foreground model that needs the GPU too? Run SGLang as a server of its own and point the openai
backend at it (tensor parallel inside the server, a router in front of several servers):

    python -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --tp 2 --port 30000
    duplex serve --background openai --background-url http://127.0.0.1:30000/v1 \
        --background-model Qwen/Qwen2.5-7B-Instruct

SGLang's streaming sessions keep one conversation's KV cache resident between requests, so each new
background request only prefills what was said since the last one: open one per duplex session
(`POST /open_session` with `{"capacity_of_str_len": N, "streaming": true}` on the SGLang server) and
send its id with each request (`session_params: {"id": ...}`), which `OpenAIConfig.extra_body`
passes through where your SGLang version accepts it on the chat endpoint (otherwise on `/generate`).

Not exercised by this repository's CI (no GPU, and sglang is not a dependency): tool calls are not
offered through this path (`supports_tools = False`); use the openai backend against an SGLang server
with `--tool-call-parser` for tools.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from models.background.base import Delta, Done, Message, ReasonerError, TextDelta, ToolChoice, ToolSpec


@dataclass
class SGLangConfig:
    model_path: str  # a Hugging Face model id or a local directory (must already be on disk)
    max_tokens: int = 512
    temperature: float = 0.3
    engine_args: dict[str, Any] = field(
        default_factory=dict
    )  # e.g. {"tp_size": 2, "mem_fraction_static": 0.3}


class SGLangReasoner:
    supports_tools = False

    def __init__(self, config: SGLangConfig) -> None:
        try:
            import sglang
        except ImportError as exc:
            raise ReasonerError(
                "missing_dependency",
                f"the sglang background backend needs the 'sglang' package "
                f"and a CUDA GPU ({exc}); install sglang, or run SGLang as a server and use "
                "--background openai --background-url http://HOST:PORT/v1",
            ) from exc
        self.config = config
        self.name = f"sglang:{config.model_path}"
        self._engine = sglang.Engine(model_path=config.model_path, **config.engine_args)
        self._tokenizer = self._engine.tokenizer_manager.tokenizer

    async def aclose(self) -> None:
        self._engine.shutdown()

    async def stream(self, messages: list[Message], tools: list[ToolSpec],
                     tool_choice: ToolChoice = "auto") -> AsyncGenerator[Delta, None]:
        prompt = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        params = {"max_new_tokens": self.config.max_tokens, "temperature": self.config.temperature}
        try:
            gen = await self._engine.async_generate(prompt=prompt, sampling_params=params, stream=True)
            seen, tokens, finish = "", 0, "stop"
            async for out in gen:
                text = out.get("text", "")
                # Depending on the version, chunks carry the text so far or only the new piece.
                piece = text[len(seen) :] if text.startswith(seen) else text
                seen = text if text.startswith(seen) else seen + text
                if piece:
                    yield TextDelta(piece)
                meta = out.get("meta_info", {})
                tokens = int(meta.get("completion_tokens", tokens))
                reason = meta.get("finish_reason")
                if isinstance(reason, dict):
                    finish = str(reason.get("type", finish))
        except ReasonerError:
            raise
        except Exception as exc:
            raise ReasonerError(
                "backend_failed", f"SGLang engine failed while generating: {type(exc).__name__}: {exc}"
            ) from exc
        yield Done(finish, tokens)
