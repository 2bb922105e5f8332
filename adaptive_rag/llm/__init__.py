"""LLM adapters and the factory that picks one from settings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from adaptive_rag.ports import LLM

if TYPE_CHECKING:  # settings import the reader registry from this package
    from adaptive_rag.settings import Settings


def build_llm(settings: Settings) -> LLM:
    """OpenAI-compatible client when `LLM_BASE_URL` is set, else the embedded llama.cpp reader."""
    from adaptive_rag.settings import prompt_style

    if settings.llm_base_url:
        from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM

        return OpenAICompatibleLLM(
            settings.llm_base_url,
            settings.llm_model,
            api_key=settings.llm_api_key,
            api=settings.llm_api,
            timeout_s=settings.llm_timeout_s,
            max_retries=settings.llm_max_retries,
            prompt_style=prompt_style(settings),
        )
    from adaptive_rag.llm.llama_cpp import LlamaCppLLM

    return LlamaCppLLM(
        embedded_model_path(settings), n_ctx=settings.llm_context,
        n_threads=settings.llm_threads, prompt_style=prompt_style(settings),
    )


def embedded_model_path(settings: Settings) -> Path:
    """`ARAG_GGUF_PATH` when set, else the configured reader, assembled and verified."""
    from adaptive_rag.llm.readers import assemble

    return settings.gguf_path or assemble(settings.reader, settings.cache_dir)
