"""Embedded generator: a GGUF model run in-process by llama.cpp (`llama-cpp-python`).

Base models (Gemma 3 270M, no chat template) complete few-shot text; instruction models (Qwen)
answer chat messages through the chat template stored in their GGUF, which llama.cpp applies.
Which is which comes from the reader registry (`adaptive_rag.llm.readers`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from adaptive_rag.domain import Completion
from adaptive_rag.errors import ConfigurationError


class LlamaCppLLM:
    """`LLM` port over llama.cpp; greedy decoding, thread-safe (one call at a time)."""

    def __init__(
        self, model_path: Path, *, n_ctx: int = 4096, n_threads: int | None = None, seed: int = 0,
        prompt_style: str = "completion",
    ) -> None:
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ConfigurationError(f"GGUF model not found: {model_path}")
        from llama_cpp import (
            Llama,  # imported here: the wheel is large and optional for clients
        )

        self.model_path = model_path
        self.n_ctx = n_ctx
        self.prompt_style = prompt_style
        self._llama = Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=n_threads or os.cpu_count() or 1,
            seed=seed,
            verbose=False,
        )
        self._lock = threading.Lock()

    def _fit(self, prompt: str, max_tokens: int) -> str:
        """Trim the prompt's middle so prompt + answer fit in the context window."""
        budget = self.n_ctx - max_tokens - 64
        tokens = self._llama.tokenize(prompt.encode("utf-8"), add_bos=False)
        if len(tokens) <= budget:
            return prompt
        head, tail = tokens[: budget // 4], tokens[-(budget - budget // 4) :]
        return (
            self._llama.detokenize(head).decode("utf-8", "ignore")
            + "\n...\n"
            + self._llama.detokenize(tail).decode("utf-8", "ignore")
        )

    def generate(self, prompt: str, max_tokens: int, stop: Sequence[str] = ()) -> Completion:
        with self._lock:
            response = self._llama.create_completion(
                self._fit(prompt, max_tokens),
                max_tokens=max_tokens,
                temperature=0.0,
                top_k=1,
                stop=list(stop) or None,
            )
        usage = response.get("usage") or {}
        return Completion(
            text=response["choices"][0]["text"] or "",
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )

    def chat(
        self, messages: Sequence[Mapping[str, str]], max_tokens: int, stop: Sequence[str] = ()
    ) -> Completion:
        fitted = [dict(m) for m in messages]
        fitted[-1]["content"] = self._fit(fitted[-1]["content"], max_tokens + 256)
        with self._lock:
            response = self._llama.create_chat_completion(
                messages=fitted,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=0.0,
                top_k=1,
                stop=list(stop) or None,
            )
        usage = response.get("usage") or {}
        return Completion(
            text=response["choices"][0]["message"].get("content") or "",
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )
