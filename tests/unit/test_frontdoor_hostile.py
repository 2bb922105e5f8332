"""Hostile and awkward inputs through the real gRPC server (in process, on loopback): huge
identifiers are never echoed into a status message, a body that is not a protobuf message is
INVALID_ARGUMENT with a stable message, a query of exactly the maximum length never silently
gives an empty answer, and `query_text` (plain text, for JSON clients) works beside `query`."""

from __future__ import annotations

import grpc
import pytest
from fakes import FakeLLM, FakeRetriever, make_passages
from google.protobuf import json_format
from grpc_health.v1 import health_pb2
from test_frontdoor import (
    AUTH, LIBRARY, TIERS, WRITER, WRITER_KEY, Harness, make_settings, status_of, told,
)

from adaptive_rag.contracts import AnswerResult, AnswerStyle, AnswerTask, CallError, ErrorCode, Scope
from adaptive_rag.serving.answering import EMPTY_ANSWER, Delivery, answer_task
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import Abstention
from services.frontdoor.server import MAX_STATUS_MESSAGE_CHARS, clip, status_for
from services.frontdoor.stubs import pb2

HUGE = 100_000


@pytest.fixture
def harness():
    h = Harness(make_settings())
    yield h
    h.close()


def raw_call(harness: Harness, method: str, body: bytes, timeout: float = 5.0) -> grpc.RpcError:
    """Send `body` as the request bytes of `method`, unparsed (what a broken client sends)."""
    call = harness.channel.unary_unary(method)  # no serializer: bytes go out as they are
    with pytest.raises(grpc.RpcError) as info:
        call(body, metadata=AUTH, timeout=timeout)
    return info.value


def assert_bounded(error: grpc.RpcError, code: grpc.StatusCode) -> None:
    assert error.code() is code, (error.code(), error.details()[:200])
    assert len(error.details()) <= MAX_STATUS_MESSAGE_CHARS
    assert "r" * 100 not in error.details() and "x" * 100 not in error.details()


# --- huge inputs are never echoed ----------------------------------------------------------------

def test_a_huge_request_id_is_rejected_without_echoing_it(harness):
    big = "r" * HUGE
    assert_bounded(status_of(harness.stub.GetResult, pb2.GetResultRequest(request_id=big),
                             metadata=AUTH, timeout=5), grpc.StatusCode.INVALID_ARGUMENT)
    assert_bounded(status_of(harness.stub.SubmitFeedback, pb2.FeedbackRequest(request_id=big, rating=1),
                             metadata=AUTH, timeout=5), grpc.StatusCode.INVALID_ARGUMENT)
    assert_bounded(status_of(harness.answer, "What is 2+2?", client_request_id="x" * HUGE),
                   grpc.StatusCode.INVALID_ARGUMENT)


def test_a_huge_document_id_is_rejected_without_echoing_it(harness):
    harness.store.add_key(WRITER_KEY, "initech", frozenset({Scope.KB_WRITE}))
    doc = pb2.Document(id="x" * HUGE, title="t", text="some text")
    error = status_of(harness.kb.UpsertDocuments, pb2.UpsertDocumentsRequest(documents=[doc]),
                      metadata=WRITER, timeout=5)
    assert_bounded(error, grpc.StatusCode.INVALID_ARGUMENT)


def test_a_huge_worker_error_stays_in_the_logs_and_the_client_gets_its_own_status():
    def failing(task: AnswerTask) -> AnswerResult:
        return AnswerResult(request_id=task.request_id, tier=task.tier, strategy=task.strategy,
                            error="boom " + "x" * HUGE, error_code=ErrorCode.INTERNAL)

    h = Harness(make_settings(), work=failing)
    try:
        error = status_of(h.answer, "What is 2+2?")
        assert error.code() is grpc.StatusCode.INTERNAL  # not RESOURCE_EXHAUSTED (header too big)
        assert told(error, CallError.ANSWER_FAILED) and "boom" not in error.details()
        assert len(error.details()) <= MAX_STATUS_MESSAGE_CHARS
    finally:
        h.close()


def test_clip_keeps_short_messages_and_says_how_long_a_cut_one_was():
    assert clip("short") == "short"
    cut = clip("y" * 1000, 100)
    assert len(cut) == 100 and cut.endswith("... (1000 characters)")
    from adaptive_rag.errors import InvalidRequestError

    assert status_for(InvalidRequestError("z" * HUGE)) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                          CallError.INVALID_REQUEST)


# --- bodies that are not protobuf messages -----------------------------------------------------

@pytest.mark.parametrize("body", [
    b"\xff\xff\xff\xff garbage",  # an invalid tag
    b"\x0a\xff\x01abc",  # field 1 claims 255 bytes, 3 follow
    b"\x1a\x02\xff\xfe",  # query_text (a string) holding invalid UTF-8
])
def test_a_body_that_is_not_a_protobuf_message_is_invalid_argument(harness, body):
    error = raw_call(harness, "/adaptive_rag.v1.AdaptiveRag/Answer", body)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and told(error, CallError.UNDECODABLE_REQUEST)
    for internal in ("DecodeError", "class", "Unexpected", "google.protobuf"):
        assert internal not in error.details()
    assert harness.store.requests == {}


def test_every_service_rejects_undecodable_bodies_the_same_way(harness):
    for method in ["/adaptive_rag.v1.AdaptiveRag/Route", "/adaptive_rag.v1.KnowledgeBase/UpsertDocuments",
                   "/grpc.health.v1.Health/Check"]:
        error = raw_call(harness, method, b"\xff\xff\xff")
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, method
        assert told(error, CallError.UNDECODABLE_REQUEST), method
    # a well-formed request still works through the same guard
    assert harness.answer("What is 2+2?")[0].answer == "answer to What is 2+2?"


def test_an_undecodable_message_inside_a_client_stream_is_invalid_argument(harness):
    harness.store.add_key(WRITER_KEY, "initech", frozenset({Scope.KB_WRITE}))
    stream = harness.channel.stream_unary("/adaptive_rag.v1.KnowledgeBase/StreamDocuments")
    good = pb2.Document(id="ok", title="Fine", text="a fine document").SerializeToString()
    with pytest.raises(grpc.RpcError) as info:
        stream(iter([good, b"\xff\xff\xff"]), metadata=WRITER, timeout=5)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert told(info.value, CallError.UNDECODABLE_REQUEST)


def test_health_watch_and_reflection_still_work_behind_the_guard(harness):
    from grpc_health.v1 import health_pb2_grpc

    watch = health_pb2_grpc.HealthStub(harness.channel).Watch(health_pb2.HealthCheckRequest(), timeout=2)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


# --- a query of exactly the maximum length -------------------------------------------------------

class Resources:
    """What the worker's use case needs, with a model that stops at once on long questions (as
    Gemma 3 270M did on a 4,000-character query: one completion token, a newline)."""

    def __init__(self) -> None:
        self.settings = Settings(_env_file=None, top_k=2)
        self._llm = FakeLLM(lambda prompt: "" if "x" * 100 in prompt else "Lumora Lighting")

    def retriever(self, tenant: str):
        return FakeRetriever(make_passages(4))

    def abstention(self, tenant: str) -> Abstention:
        return Abstention()

    def answer_style(self, tenant: str) -> AnswerStyle:
        return AnswerStyle.SHORT

    def llm(self):
        return self._llm


def test_a_query_of_the_maximum_length_never_silently_gets_an_empty_answer():
    resources = Resources()

    def worker(task: AnswerTask) -> AnswerResult:  # the real use case a worker runs
        return answer_task(task, h.store, resources, Delivery("tier-b@test/1", 1, may_retry=False))

    h = Harness(make_settings(), work=worker)
    try:
        longest = "x" * LIBRARY.max_query_chars
        reply, _ = h.answer(longest)
        assert reply.answer == "" and not reply.answerable
        assert reply.unanswerable_reason == EMPTY_ANSWER
        assert h.store.get_result(reply.request_id).abstain_reason == EMPTY_ANSWER  # recorded so
        error = status_of(h.answer, longest + "x")  # one more character: rejected, precisely
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and told(error, CallError.QUERY_TOO_LONG)
        normal, _ = h.answer("Who makes Lumora lamps?")
        assert normal.answer == "Lumora Lighting" and normal.answerable
    finally:
        h.close()


# --- query_text: plain text beside the bytes field -----------------------------------------------

def test_query_text_answers_like_query_bytes(harness):
    for query in TIERS:
        by_text = harness.stub.Answer(pb2.AnswerRequest(query_text=query), metadata=AUTH, timeout=5)
        by_bytes, _ = harness.answer(query)
        assert by_text.answer == by_bytes.answer == f"answer to {query}"
        assert by_text.tier == by_bytes.tier
    routed = harness.stub.Route(pb2.RouteRequest(query_text="Which is older, X or Y?"), metadata=AUTH)
    assert routed.tier == pb2.TIER_C


def test_a_json_client_sends_plain_text(harness):
    """What grpcurl -d '{"query_text": "..."}' sends: parsed from JSON, no base64."""
    request = json_format.Parse('{"query_text": "Who makes Lumora lamps?", "client_request_id": "j1"}',
                                pb2.AnswerRequest())
    reply = harness.stub.Answer(request, metadata=AUTH, timeout=5)
    assert reply.answer == "answer to Who makes Lumora lamps?"
    camel = json_format.Parse('{"queryText": "Who makes Lumora lamps?", "clientRequestId": "j1"}',
                              pb2.AnswerRequest())
    assert harness.stub.Answer(camel, metadata=AUTH, timeout=5).replayed


def test_query_and_query_text_are_one_choice(harness):
    request = pb2.AnswerRequest(query=b"What is 2+2?")
    request.query_text = "Who makes Lumora lamps?"  # setting one clears the other
    assert request.WhichOneof("query_input") == "query_text" and request.query == b""
    with pytest.raises(json_format.ParseError):  # a JSON client cannot send both
        json_format.Parse('{"query": "eA==", "query_text": "x"}', pb2.AnswerRequest())
    error = status_of(harness.stub.Answer, pb2.AnswerRequest(), metadata=AUTH, timeout=5)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and told(error, CallError.QUERY_EMPTY)
    error = status_of(harness.stub.Answer, pb2.AnswerRequest(query_text="lamp\x00 colour"), metadata=AUTH,
                      timeout=5)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and told(error, CallError.QUERY_CONTROL_CHARACTER)


def test_an_old_client_with_the_bytes_field_is_unchanged(harness):
    old_wire = b"\x0a" + bytes([len(b"What is 2+2?")]) + b"What is 2+2?"  # field 1, as before
    assert pb2.AnswerRequest.FromString(old_wire).WhichOneof("query_input") == "query"
    call = harness.channel.unary_unary("/adaptive_rag.v1.AdaptiveRag/Answer",
                                       response_deserializer=pb2.AnswerReply.FromString)
    assert call(old_wire, metadata=AUTH, timeout=5).answer == "answer to What is 2+2?"
