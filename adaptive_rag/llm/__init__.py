"""LLM adapters and the factory that picks one from settings."""

from __future__ import annotations

from adaptive_rag.ports import LLM
from adaptive_rag.settings import Settings


def build_llm(settings: Settings) -> LLM:
    """OpenAI-compatible client when `LLM_BASE_URL` is set, else the embedded llama.cpp model."""
    if settings.llm_base_url:
        from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM

        return OpenAICompatibleLLM(
            settings.llm_base_url,
            settings.llm_model,
            api_key=settings.llm_api_key,
            api=settings.llm_api,
            timeout_s=settings.llm_timeout_s,
            max_retries=settings.llm_max_retries,
        )
    from adaptive_rag.llm.llama_cpp import LlamaCppLLM, default_gguf_path

    path = settings.gguf_path or default_gguf_path(settings.cache_dir)
    return LlamaCppLLM(path, n_ctx=settings.llm_context, n_threads=settings.llm_threads)
