"""Generator over any OpenAI-compatible HTTP endpoint (vLLM, TGI, llama.cpp server, hosted APIs).

Chat prompts (instruction models, `prompt_style="chat"`) always go as their messages to
`/v1/chat/completions`. Completion prompts (base models) go, with `api="chat"` (default), as one
user message to the same endpoint, which every such server and hosted API offers; with
`api="completions"` as raw text to `/v1/completions`, the right choice for base models. Greedy decoding; token log-probabilities are requested and kept
when the server returns them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import httpx
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from adaptive_rag.domain import Completion
from adaptive_rag.errors import LLMUnavailableError

_RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in _RETRYABLE_STATUS


def _logprobs(block: dict | None) -> list[float] | None:
    """Token log-probabilities from a chat (`content[].logprob`) or completions
    (`token_logprobs`) response block."""
    if not block:
        return None
    if block.get("content"):
        return [float(t["logprob"]) for t in block["content"]]
    if block.get("token_logprobs"):
        return [float(x) for x in block["token_logprobs"] if x is not None]
    return None


class OpenAICompatibleLLM:
    """`LLM` port over an OpenAI-compatible chat-completions endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        api: Literal["chat", "completions"] = "chat",
        logprobs: bool = True,
        transport: httpx.BaseTransport | None = None,
        prompt_style: Literal["completion", "chat"] = "completion",
    ) -> None:
        self.prompt_style = prompt_style
        base = base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.api = api
        self.logprobs = logprobs
        self._client = httpx.Client(
            base_url=base,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
            transport=transport,
        )
        self._post = retry(
            retry=retry_if_exception(_is_transient),
            stop=stop_after_attempt(max_retries + 1),
            wait=wait_exponential_jitter(multiplier=0.2, max=5.0),
            reraise=True,
        )(self._post_once)

    def _post_once(self, payload: dict) -> dict:
        path = "/chat/completions" if "messages" in payload else "/completions"
        response = self._client.post(path, json=payload)
        response.raise_for_status()
        return response.json()

    def generate(self, prompt: str, max_tokens: int, stop: Sequence[str] = ()) -> Completion:
        if self.api == "chat":
            return self._complete({"messages": [{"role": "user", "content": prompt}]}, max_tokens, stop)
        return self._complete({"prompt": prompt}, max_tokens, stop)

    def chat(
        self, messages: Sequence[Mapping[str, str]], max_tokens: int, stop: Sequence[str] = ()
    ) -> Completion:
        return self._complete({"messages": [dict(m) for m in messages]}, max_tokens, stop)

    def _complete(self, prompt: dict, max_tokens: int, stop: Sequence[str]) -> Completion:
        """POST one request: `prompt` holds `messages` (chat endpoint) or `prompt` (completions)."""
        payload: dict = {
            "model": self.model, "max_tokens": max_tokens, "temperature": 0.0, **prompt
        }
        if stop:
            payload["stop"] = list(stop)[:4]  # the OpenAI API accepts at most four
        if self.logprobs:
            payload["logprobs"] = True if "messages" in payload else 1
        try:
            body = self._post(payload)
        except (httpx.HTTPError, ValueError) as exc:
            raise LLMUnavailableError(
                f"LLM endpoint {self._client.base_url} failed: {exc}"
            ) from exc
        try:
            choice = body["choices"][0]
            text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise LLMUnavailableError(f"LLM endpoint returned an unexpected body: {body!r:.200}") from exc
        usage = body.get("usage") or {}
        return Completion(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            token_logprobs=_logprobs(choice.get("logprobs")),
        )

    def close(self) -> None:
        self._client.close()
