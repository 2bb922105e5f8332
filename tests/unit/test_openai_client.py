"""OpenAI-compatible HTTP generator: payloads, parsing, retries, against a stand-in for urllib3's
pool manager; one real round trip over loopback at the end."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from urllib3.exceptions import NewConnectionError, ProtocolError

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


@dataclass
class Sent:
    method: str
    url: str
    headers: dict[str, str]
    content: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.url).path


@dataclass
class Reply:
    status: int
    data: bytes


class Server:
    """Stand-in for urllib3's PoolManager: answers with queued (status, body) pairs, then repeats
    the last; records what was sent. A body that is an exception is raised instead."""

    def __init__(self, *responses: tuple[int, object]) -> None:
        self.responses = list(responses)
        self.requests: list[Sent] = []
        self.cleared = False

    def request(self, method: str, url: str, *, body: bytes, headers: dict[str, str]) -> Reply:
        self.requests.append(Sent(method, url, {k.lower(): v for k, v in headers.items()}, body))
        status, reply = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, str):
            reply = reply.encode()
        return Reply(status, reply if isinstance(reply, bytes) else json.dumps(reply).encode())

    def clear(self) -> None:
        self.cleared = True

    @property
    def payloads(self) -> list[dict]:
        return [json.loads(r.content) for r in self.requests]


def make_llm(server: Server, *, sleeps: list[float] | None = None, **kwargs) -> OpenAICompatibleLLM:
    kwargs.setdefault("base_url", "http://llm.test")
    kwargs.setdefault("model", "m")
    llm = OpenAICompatibleLLM(http=server, **kwargs)
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
    assert request.headers["content-type"] == "application/json"
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
    assert server.requests[0].path == "/v1/completions"
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
    assert server.requests[0].url == "http://llm.test/v1/chat/completions"


def test_base_url_with_path_prefix() -> None:
    server = Server((200, CHAT_BODY))
    make_llm(server, base_url="http://gw.test/openai").generate("p", 4)
    assert server.requests[0].url == "http://gw.test/openai/v1/chat/completions"


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_retries_transient_status_then_succeeds(status: int) -> None:
    server = Server((status, {"error": "busy"}), (status, {"error": "busy"}), (200, CHAT_BODY))
    sleeps: list[float] = []
    completion = make_llm(server, max_retries=3, sleeps=sleeps).generate("p", 4)
    assert completion.text == "Paris"
    assert len(server.requests) == 3
    assert len(sleeps) == 2 and all(0 < s <= 5.0 for s in sleeps)


@pytest.mark.parametrize("error", [
    NewConnectionError(None, "refused"),  # type: ignore[arg-type]
    ProtocolError("Connection aborted.", ConnectionResetError(104, "reset")),
])
def test_retries_transport_errors(error: Exception) -> None:
    server = Server((0, error), (200, CHAT_BODY))
    assert make_llm(server).generate("p", 4).text == "Paris"
    assert len(server.requests) == 2


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
    server = Server((200, CHAT_BODY))
    llm = make_llm(server)
    llm.close()
    assert server.cleared
    with pytest.raises(LLMUnavailableError, match="closed"):
        llm.generate("p", 4)
    assert server.requests == []


@pytest.mark.parametrize(("timeout_s", "connect"), [(60.0, 5.0), (2.0, 2.0)])
def test_timeouts(timeout_s: float, connect: float) -> None:
    llm = make_llm(Server((200, CHAT_BODY)), timeout_s=timeout_s)
    assert llm.timeout.read_timeout == timeout_s
    assert llm.timeout.connect_timeout == connect


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
    assert server.requests[0].path.endswith("/chat/completions")


class _Endpoint(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((self.path, self.headers.get("Authorization", ""), json.loads(body)))
        reply = json.dumps(CHAT_BODY).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


def test_a_real_round_trip_over_loopback_reuses_its_connection() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        llm = OpenAICompatibleLLM(f"http://127.0.0.1:{server.server_port}", "m", api_key="k")
        assert [llm.generate(f"q{i}", 4).text for i in range(3)] == ["Paris"] * 3
        assert [(p, a, b["messages"][0]["content"]) for p, a, b in _Endpoint.seen] == [
            ("/v1/chat/completions", "Bearer k", f"q{i}") for i in range(3)]
        pool = llm._http.connection_from_url(llm.base_url)  # type: ignore[attr-defined]
        assert pool.num_connections == 1  # kept alive between calls
        llm.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_refused_connection_is_llm_unavailable_after_the_retries() -> None:
    probe = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    port = probe.server_port
    probe.server_close()  # nothing listens there now
    llm = OpenAICompatibleLLM(f"http://127.0.0.1:{port}", "m", max_retries=1)
    llm._post.retry.sleep = lambda seconds: None
    with pytest.raises(LLMUnavailableError, match=f"127.0.0.1:{port}"):
        llm.generate("p", 4)


class _LoadingThenReady(BaseHTTPRequestHandler):
    """`GET /v1/models`: 503 while `loading` (as llama-server says while it loads the model), then 200."""

    loading = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status = 503 if _LoadingThenReady.loading or self.path != "/v1/models" else 200
        body = b'{"data": [{"id": "m"}]}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_readiness_says_loading_then_ready_and_unreachable_when_nothing_listens() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LoadingThenReady)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        llm = OpenAICompatibleLLM(f"http://127.0.0.1:{server.server_port}", "m")
        assert llm.readiness_problem() == f"LLM endpoint {llm.base_url} not ready (HTTP 503)"
        _LoadingThenReady.loading = False
        assert llm.readiness_problem() is None
    finally:
        server.shutdown()
        server.server_close()
    problem = llm.readiness_problem()  # the port is closed now
    assert problem is not None and "unreachable" in problem
