"""LLM adapters and the factory that picks one from settings."""

from __future__ import annotations

import threading
from pathlib import Path

from adaptive_rag.ports import LLM
from adaptive_rag.settings import Settings, prompt_style


def build_llm(settings: Settings, *, logprobs: bool | None = None) -> LLM:
    """OpenAI-compatible client when `LLM_BASE_URL` is set, else the embedded llama.cpp reader.

    `logprobs` makes completions carry token log-probabilities. The HTTP client asks the server
    for them only when something reads them (default `settings.wants_logprobs`: a server sorts
    the whole vocabulary for every generated token to give them); the embedded model is loaded
    with them (`logits_all`) when `settings.llm_logprobs` says so.
    """
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
            logprobs=settings.wants_logprobs if logprobs is None else logprobs,
        )
    from adaptive_rag.llm.llama_cpp import LlamaCppLLM

    return LlamaCppLLM(
        embedded_model_path(settings), n_ctx=settings.llm_context,
        n_threads=settings.llm_threads, prompt_style=prompt_style(settings),
        logprobs=settings.llm_logprobs if logprobs is None else logprobs,
    )


# The log-probability copy keeps logits for every position (n_ctx x vocabulary floats, 1.2 GB of
# address space for Qwen at 2048); its drafts are the short no-retrieval prompt, so its context
# is capped here.
LOGPROB_CONTEXT = 2048
_LOGPROB_LLMS: dict[tuple, LLM] = {}
_LOGPROB_LOCK = threading.Lock()


def logprob_llm(settings: Settings, llm: LLM | None = None) -> LLM:
    """A generator whose completions carry token log-probabilities, for the uncertainty drafts.

    `llm` itself when it already reports them (an HTTP endpoint, or `ARAG_LLM_LOGPROBS` set);
    otherwise one log-probability instance of the configured model per process, loaded on first
    use and shared by every strategy built afterwards, so the slower `logits_all` model never
    serves the other strategies.
    """
    if llm is not None and getattr(llm, "logprobs", False):
        return llm
    key = (
        settings.llm_base_url, settings.llm_model, settings.llm_api, settings.reader,
        settings.prompt_style, str(settings.gguf_path), str(settings.cache_dir), settings.llm_context,
        settings.llm_threads,
    )
    with _LOGPROB_LOCK:
        if key not in _LOGPROB_LLMS:
            capped = settings.model_copy(
                update={"llm_context": min(settings.llm_context, LOGPROB_CONTEXT)}
            )
            _LOGPROB_LLMS[key] = build_llm(capped, logprobs=True)
        return _LOGPROB_LLMS[key]


def embedded_model_path(settings: Settings) -> Path:
    """`ARAG_GGUF_PATH` when set, else the configured reader, assembled and verified."""
    from adaptive_rag.readers import assemble

    return settings.gguf_path or assemble(settings.reader, settings.cache_dir)
