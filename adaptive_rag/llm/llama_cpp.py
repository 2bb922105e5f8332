"""Embedded generator: a GGUF model run in-process by llama.cpp (`llama-cpp-python`).

Base models (Gemma 3 270M, no chat template) complete few-shot text; instruction models (Qwen)
answer chat messages through the chat template stored in their GGUF, which llama.cpp applies.
Which is which comes from the reader registry (`adaptive_rag.readers`).

With `logprobs=True` the model is loaded with `logits_all` (llama.cpp keeps the logits of every
position) and each completion carries the log-probability of every token of its returned text.
They are read from those logits here rather than requested from `create_completion(logprobs=...)`,
whose Python post-processing (a log-softmax over every prompt position and a full-vocabulary sort
per generated token) added about 0.3 s plus 0.17 s per generated token with Qwen's 152k-token
vocabulary on this machine, as much as a whole short draft. Off by default: only the uncertainty
strategy's drafts need them (`adaptive_rag.llm.logprob_llm`).
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from adaptive_rag.domain import Completion
from adaptive_rag.errors import ConfigurationError


def _close_at_exit(model: weakref.ref) -> None:
    """Free a model still alive at exit while the interpreter has its modules: left to
    llama-cpp-python's `__del__` during shutdown, it prints an AttributeError traceback."""
    llama = model()
    if llama is not None:
        llama.close()


class LlamaCppLLM:
    """`LLM` port over llama.cpp; greedy decoding, thread-safe (one call at a time)."""

    def __init__(
        self, model_path: Path, *, n_ctx: int = 4096, n_threads: int | None = None, seed: int = 0,
        prompt_style: str = "completion", logprobs: bool = False,
    ) -> None:
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ConfigurationError(f"GGUF model not found: {model_path}")
        try:
            from llama_cpp import Llama  # imported here: optional (the demo's set reads through a server)
        except ImportError as exc:
            raise ConfigurationError(
                "the embedded reader needs llama-cpp-python (the `workers` extra: make setup-workers), "
                "or point LLM_BASE_URL at an OpenAI-compatible server"
            ) from exc

        self.model_path = model_path
        self.n_ctx = n_ctx
        self.prompt_style = prompt_style
        self.logprobs = logprobs
        self._llama = Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=n_threads or os.cpu_count() or 1,
            seed=seed,
            logits_all=logprobs,
            verbose=False,
        )
        atexit.register(_close_at_exit, weakref.ref(self._llama))
        self._lock = threading.Lock()

    def forget_context(self) -> None:
        """Drop the evaluated prompt llama.cpp keeps for prefix reuse, so the next call is timed as
        a fresh request's. An evaluation runs several strategies on one question in one process;
        without this, a strategy whose prompt repeats the previous one's (the same passages, the
        same instructions) skips most of its prompt processing, which no served request would."""
        with self._lock:
            self._llama.reset()

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
            return self._completion(response["choices"][0]["text"] or "", response)

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
            return self._completion(response["choices"][0]["message"].get("content") or "", response)

    def _completion(self, text: str, response: Mapping) -> Completion:
        """The `Completion` of the call that just ran (called under the lock: the log-probabilities
        are read from the model's logits before another call overwrites them)."""
        usage = response.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens", 0))
        completion_tokens = int(usage.get("completion_tokens", 0))
        return Completion(
            text=text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
            token_logprobs=(
                self._greedy_logprobs(text, prompt_tokens, completion_tokens)
                if self.logprobs else None
            ),
        )

    def _greedy_logprobs(self, text: str, prompt_tokens: int, completion_tokens: int) -> list[float]:
        """Log-probability of each generated token of `text`, from the kept logits.

        Decoding is greedy (temperature 0, no penalties), so generated token j is the argmax of
        the logits at position `prompt_tokens - 1 + j` and its log-probability is that row's
        largest log-softmax value.
        """
        import numpy as np

        if completion_tokens <= 0 or prompt_tokens <= 0:
            return []
        rows = np.asarray(
            self._llama.scores[prompt_tokens - 1 : prompt_tokens - 1 + completion_tokens],
            dtype=np.float64,
        )
        top = rows.max(axis=1)
        logprobs = -np.log(np.exp(rows - top[:, None]).sum(axis=1))
        ids = [int(i) for i in rows.argmax(axis=1)]
        pieces = [
            self._llama.detokenize([token], prev_tokens=ids[:j]).decode("utf-8", "ignore")
            for j, token in enumerate(ids)
        ]
        return text_logprobs(pieces, logprobs.tolist(), text)


def text_logprobs(
    tokens: Sequence[str], logprobs: Sequence[float | None], text: str
) -> list[float]:
    """The log-probabilities of the tokens that make up `text`.

    llama.cpp generates, and counts, the token that held a stop string, which the returned text
    no longer contains; a token is kept while it starts inside `text` (leading whitespace the
    caller may strip still counts as text here).
    """
    kept: list[float] = []
    start = 0
    for token, logprob in zip(tokens, logprobs):
        if start >= len(text):
            break
        if logprob is not None:
            kept.append(float(logprob))
        start += len(token)
    return kept
