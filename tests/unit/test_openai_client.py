"""OpenAI-compatible HTTP generator against httpx.MockTransport: payloads, parsing, retries."""

from __future__ import annotations

import json

import httpx
import pytest

from adaptive_rag.errors import LLMUnavailableError
from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM
from adaptive_rag.ports import LLM

CHAT_BODY = {
    "choices": [{
        "message": {"role": "assistant", "content": "Paris"},
        "logprobs": {"content": [
            {"token": "Par", "logprob": -0.25}, {"token": "is", "logprob": -0.5},
        ]},
    }],
    "usage": {"prompt_tokens": 12, "completion_tokens": 2},
}
COMPLETIONS_BODY = {
    "choices": [{"text": " Paris", "logprobs": {"token_logprobs": [None, -0.1, -0.2]}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3},
}


class Server:
    """Mock endpoint: answers with queued (status, body) pairs, then repeats the last; records."""

    def __init__(self, *responses: tuple[int, object]) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status, body = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(body, (bytes, str)):
            return httpx.Response(status, content=body)
        return httpx.Response(status, json=body)

    @property
    def payloads(self) -> list[dict]:
        return [json.loads(r.content) for r in self.requests]


def make_llm(server: Server, *, sleeps: list[float] | None = None, **kwargs) -> OpenAICompatibleLLM:
    kwargs.setdefault("base_url", "http://llm.test")
    kwargs.setdefault("model", "m")
    llm = OpenAICompatibleLLM(transport=httpx.MockTransport(server), **kwargs)
    # Never really sleep between retries; record the waits the backoff asked for.
    record = sleeps if sleeps is not None else []
    llm._post.retry.sleep = record.append
    return llm


def test_it_satisfies_the_port() -> None:
    assert isinstance(make_llm(Server((200, CHAT_BODY))), LLM)


def test_chat_payload_and_parsing() -> None:
    server = Server((200, CHAT_BODY))
    llm = make_llm(server, model="gpt-x", api_key="sk-123")
    completion = llm.generate("Q?", 16, stop=("\n", "A", "B", "C", "D", "E"))
    request = server.requests[0]
    assert request.method == "POST"
    assert request.url == "http://llm.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-123"
    payload = server.payloads[0]
    assert payload == {
        "model": "gpt-x", "max_tokens": 16, "temperature": 0.0,
        "messages": [{"role": "user", "content": "Q?"}],
        "stop": ["\n", "A", "B", "C"],
        "logprobs": True,
    }
    assert completion.text == "Paris"
    assert (completion.prompt_tokens, completion.completion_tokens) == (12, 2)
    assert completion.token_logprobs == [-0.25, -0.5]


def test_completions_payload_and_parsing() -> None:
    server = Server((200, COMPLETIONS_BODY))
    llm = make_llm(server, api="completions")
    completion = llm.generate("Raw prompt", 8)
    assert server.requests[0].url.path == "/v1/completions"
    assert "authorization" not in server.requests[0].headers
    payload = server.payloads[0]
    assert payload == {
        "model": "m", "max_tokens": 8, "temperature": 0.0, "prompt": "Raw prompt", "logprobs": 1,
    }
    assert "stop" not in payload and "messages" not in payload
    assert completion.text == " Paris"
    assert (completion.prompt_tokens, completion.completion_tokens) == (7, 3)
    assert completion.token_logprobs == [-0.1, -0.2]


def test_logprobs_can_be_turned_off_and_are_optional_in_replies() -> None:
    body = {"choices": [{"message": {"content": "x"}}]}
    server = Server((200, body))
    completion = make_llm(server, logprobs=False).generate("p", 4)
    assert "logprobs" not in server.payloads[0]
    assert completion.token_logprobs is None
    assert (completion.prompt_tokens, completion.completion_tokens) == (0, 0)


def test_null_content_gives_empty_text() -> None:
    body = {"choices": [{"message": {"role": "assistant", "content": None}}]}
    assert make_llm(Server((200, body))).generate("p", 4).text == ""


@pytest.mark.parametrize(
    "base_url",
    ["http://llm.test", "http://llm.test/", "http://llm.test/v1", "http://llm.test/v1/"],
)
def test_base_url_with_or_without_v1(base_url: str) -> None:
    server = Server((200, CHAT_BODY))
    make_llm(server, base_url=base_url).generate("p", 4)
    assert str(server.requests[0].url) == "http://llm.test/v1/chat/completions"


def test_base_url_with_path_prefix() -> None:
    server = Server((200, CHAT_BODY))
    make_llm(server, base_url="http://gw.test/openai").generate("p", 4)
    assert str(server.requests[0].url) == "http://gw.test/openai/v1/chat/completions"


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_retries_transient_status_then_succeeds(status: int) -> None:
    server = Server((status, {"error": "busy"}), (status, {"error": "busy"}), (200, CHAT_BODY))
    sleeps: list[float] = []
    completion = make_llm(server, max_retries=3, sleeps=sleeps).generate("p", 4)
    assert completion.text == "Paris"
    assert len(server.requests) == 3
    assert len(sleeps) == 2 and all(0 < s <= 5.0 for s in sleeps)


def test_retries_transport_errors() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=CHAT_BODY)

    llm = OpenAICompatibleLLM("http://llm.test", "m", transport=httpx.MockTransport(handler))
    llm._post.retry.sleep = lambda seconds: None
    assert llm.generate("p", 4).text == "Paris"
    assert calls["n"] == 2


def test_gives_up_after_retries() -> None:
    server = Server((503, {"error": "down"}))
    with pytest.raises(LLMUnavailableError, match=r"http://llm.test/v1.*503"):
        make_llm(server, max_retries=2).generate("p", 4)
    assert len(server.requests) == 3


def test_no_retries_when_max_retries_is_zero() -> None:
    server = Server((503, {"error": "down"}))
    with pytest.raises(LLMUnavailableError):
        make_llm(server, max_retries=0).generate("p", 4)
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_client_errors_are_not_retried(status: int) -> None:
    server = Server((status, {"error": "bad request"}), (200, CHAT_BODY))
    with pytest.raises(LLMUnavailableError, match=str(status)):
        make_llm(server, max_retries=3).generate("p", 4)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"<html>gateway</html>",
        {"choices": []},
        {"no_choices": True},
        [1, 2, 3],
        {"choices": ["just a string"]},
        {"choices": None},
    ],
)
def test_malformed_body_is_llm_unavailable(body) -> None:
    server = Server((200, body))
    with pytest.raises(LLMUnavailableError):
        make_llm(server).generate("p", 4)
    assert len(server.requests) == 1


def test_close_closes_the_client() -> None:
    llm = make_llm(Server((200, CHAT_BODY)))
    llm.close()
    with pytest.raises((RuntimeError, LLMUnavailableError)):
        llm.generate("p", 4)


@pytest.mark.parametrize(("timeout_s", "connect"), [(60.0, 5.0), (2.0, 2.0)])
def test_timeouts(timeout_s: float, connect: float) -> None:
    llm = make_llm(Server((200, CHAT_BODY)), timeout_s=timeout_s)
    assert llm._client.timeout.read == timeout_s
    assert llm._client.timeout.connect == connect


def test_chat_prompts_go_as_their_messages() -> None:
    server = Server((200, CHAT_BODY))
    llm = make_llm(server, prompt_style="chat")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital?"}]
    assert llm.chat(messages, 8, stop=("\n",)).text == "Paris"
    assert server.payloads[0]["messages"] == messages
    assert server.payloads[0]["stop"] == ["\n"]


def test_chat_prompts_use_the_chat_endpoint_whatever_the_completion_api() -> None:
    server = Server((200, CHAT_BODY))
    llm = make_llm(server, api="completions", prompt_style="chat")
    assert llm.chat([{"role": "user", "content": "Capital?"}], 8).text == "Paris"
    assert server.requests[0].url.path.endswith("/chat/completions")
