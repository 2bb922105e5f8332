"""Generator over any OpenAI-compatible HTTP endpoint (vLLM, TGI, llama.cpp server, hosted APIs).

Chat prompts (instruction models, `prompt_style="chat"`) always go as their messages to
`/v1/chat/completions`. Completion prompts (base models) go, with `api="chat"` (default), as one
user message to the same endpoint, which every such server and hosted API offers; with
`api="completions"` as raw text to `/v1/completions`, the right choice for base models. Greedy decoding; token log-probabilities are requested and kept
when the server returns them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import urllib3
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)
from urllib3.exceptions import HTTPError as TransportError

from adaptive_rag.domain import Completion
from adaptive_rag.errors import LLMUnavailableError

_RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class HTTPStatusError(Exception):
    """The endpoint answered with an error status."""

    def __init__(self, status: int, url: str, body: bytes) -> None:
        super().__init__(f"HTTP {status} from {url}: {body[:200]!r}")
        self.status = status


class HTTPPool(Protocol):
    """What the client needs of `urllib3.PoolManager` (a unit test passes its own)."""

    def request(self, method: str, url: str, *, body: bytes | None = None, headers: Mapping[str, str],
                timeout: Any = None) -> Any: ...

    def clear(self) -> None: ...


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TransportError):  # refused, reset, timed out, closed mid-response
        return True
    return isinstance(exc, HTTPStatusError) and exc.status in _RETRYABLE_STATUS


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
        http: HTTPPool | None = None,
        prompt_style: Literal["completion", "chat"] = "completion",
    ) -> None:
        self.prompt_style = prompt_style
        base = base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        self.base_url = base
        self.model = model
        self.api = api
        self.logprobs = logprobs
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = urllib3.Timeout(connect=min(timeout_s, 5.0), read=timeout_s)
        # urllib3 rather than httpx: http.client sends a request's headers and body in one write,
        # and the client spends less CPU per call (measured against the instant endpoint here:
        # 183 us against 400-420 us per completion; the serving path makes one per B answer).
        # Retries are tenacity's below, never urllib3's own.
        # maxsize: connections kept per host for callers sharing one client across threads.
        self._http: HTTPPool = http or urllib3.PoolManager(maxsize=8, timeout=self.timeout,
                                                           retries=False)
        self._closed = False
        self._post = retry(
            retry=retry_if_exception(_is_transient),
            stop=stop_after_attempt(max_retries + 1),
            wait=wait_exponential_jitter(multiplier=0.2, max=5.0),
            reraise=True,
        )(self._post_once)

    def _post_once(self, payload: dict) -> dict:
        if self._closed:
            raise LLMUnavailableError(f"the client of {self.base_url} is closed")
        url = self.base_url + ("/chat/completions" if "messages" in payload else "/completions")
        response = self._http.request("POST", url, body=json.dumps(payload).encode(),
                                      headers=self._headers)
        if response.status >= 400:
            raise HTTPStatusError(response.status, url, response.data)
        return json.loads(response.data)

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
        except (TransportError, HTTPStatusError, ValueError) as exc:
            raise LLMUnavailableError(f"LLM endpoint {self.base_url} failed: {exc}") from exc
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

    def readiness_problem(self) -> str | None:
        """None when the endpoint serves its models now (`GET /v1/models`, which vLLM and
        llama-server answer 200 once the model is loaded; llama-server says 503 while loading),
        else what it said: a readiness check, not retried."""
        url = self.base_url + "/models"
        try:
            response = self._http.request("GET", url, headers=self._headers, timeout=urllib3.Timeout(total=2.0))
        except TransportError as exc:
            return f"LLM endpoint {self.base_url} unreachable: {type(exc).__name__}"
        if response.status != 200:
            return f"LLM endpoint {self.base_url} not ready (HTTP {response.status})"
        return None

    def close(self) -> None:
        self._closed = True
        self._http.clear()
