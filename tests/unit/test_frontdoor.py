"""The gRPC front door in process on loopback over the serving use cases, with in-memory records,
a thread "worker" and a scripted router: every status code, idempotent replay, deadline then
GetResult, shadow runs, feedback, health, reflection, metrics and JSON logs."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time

import grpc
import pytest
from frontdoor_fakes import FakeQueue, FakeRouter, FakeStore, FakeWaiter, knowledge_service
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from adaptive_rag.contracts import (
    CALL_ERROR_MESSAGES, AnswerResult, CallError, ErrorCode, RequestStatus, ResultKind, Scope, Tier,
)
from adaptive_rag.errors import AnswerFailedError
from adaptive_rag.logs import configure_logging
from adaptive_rag.settings import Settings
from services.frontdoor.metrics import FrontDoorMetrics
from services.frontdoor.server import start_server, status_for
from services.frontdoor.settings import FrontDoorSettings
from services.frontdoor.stubs import KB_SERVICE_NAME, LIVENESS_SERVICE, SERVICE_NAME, pb2, pb2_grpc

KEY, OTHER_KEY = "arag_key-of-acme", "arag_key-of-globex"
AUTH = (("authorization", f"Bearer {KEY}"),)
OTHER_AUTH = (("authorization", f"Bearer {OTHER_KEY}"),)
TIERS = {"What is 2+2?": "A", "Who makes Lumora lamps?": "B", "Which is older, X or Y?": "C"}


class Harness:
    """The aio server on its own event loop thread; tests talk to it with the sync client."""

    def __init__(self, settings: FrontDoorSettings, delay_s: float = 0.0, work=None,
                 fair_share=None, health_watch_s: float | None = None, worker_probe=None,
                 library: Settings | None = None, llm_probe=None) -> None:
        self.store = FakeStore()
        self.store.add_key(KEY, "acme")
        self.store.add_key(OTHER_KEY, "globex")
        self.queue = FakeQueue(self.store, work=work, delay_s=delay_s)
        self.router = FakeRouter(TIERS)
        self.knowledge = knowledge_service()
        self.metrics = FrontDoorMetrics()
        self.samples = [0.0]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.running = asyncio.run_coroutine_threadsafe(
            start_server(library or LIBRARY, settings, self.store, self.queue, FakeWaiter(self.queue),
                         self.router, self.knowledge, self.metrics, listen="127.0.0.1:0", poll_models=False,
                         queue_watch_s=None, sample=lambda: self.samples[0], fair_share=fair_share,
                         health_watch_s=health_watch_s, worker_probe=worker_probe, llm_probe=llm_probe),
            self.loop,
        ).result(10)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.running.port}")
        self.stub = pb2_grpc.AdaptiveRagStub(self.channel)
        self.kb = pb2_grpc.KnowledgeBaseStub(self.channel)

    def answer(self, query: str | bytes, metadata=AUTH, timeout: float = 5.0, **fields):
        raw = query.encode() if isinstance(query, str) else query
        return self.stub.Answer.with_call(pb2.AnswerRequest(query=raw, **fields), metadata=metadata,
                                          timeout=timeout)

    def close(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.running.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


LIBRARY = Settings(_env_file=None, max_query_chars=200)


def make_settings(**overrides) -> FrontDoorSettings:
    # Depths set by a test are read at once (the front door's own default re-reads every 50 ms).
    values = {"max_queue_depth": {"C": 3}, "queue_depth_max_age_s": 0.0, **overrides}
    return FrontDoorSettings(_env_file=None, **values)


@pytest.fixture
def harness():
    h = Harness(make_settings())
    yield h
    h.close()


def status_of(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


def trailing(metadata) -> dict[str, str]:
    return {k: v for k, v in metadata}


def error_code(error: grpc.RpcError) -> CallError:
    """The failed call's `x-error-code` trailer."""
    return CallError(trailing(error.trailing_metadata())["x-error-code"])


def told(error: grpc.RpcError, reason: CallError) -> bool:
    """The call failed for `reason`, with its stable message (and the request id, if it has one)."""
    request_id = trailing(error.trailing_metadata()).get("x-request-id")
    message = CALL_ERROR_MESSAGES[reason] + (f" (request {request_id})" if request_id else "")
    return error_code(error) is reason and error.details() == message


def test_answer_carries_tier_strategy_sources_classifier_and_timings(harness):
    for query, tier in TIERS.items():
        reply, call = harness.answer(query)
        assert reply.tier == {"A": pb2.TIER_A, "B": pb2.TIER_B, "C": pb2.TIER_C}[tier]
        assert reply.strategy == {"A": "no_retrieval", "B": "single_step", "C": "evidence"}[tier]
        assert reply.answer == f"answer to {query}" and reply.steps == 1 and not reply.replayed
        assert [(s.id, s.title, s.score) for s in reply.sources] == [("p1", "Lumora", 2.5)]
        assert reply.classifier.probabilities[tier] == pytest.approx(0.8)
        assert reply.classifier.model_name == "complexity" and reply.classifier.model_version == 1
        assert not reply.classifier.fallback
        assert reply.timings.queue_wait_ms == 3.0 and reply.timings.strategy_ms == 40.0
        assert reply.timings.total_ms >= reply.timings.classify_ms > 0
        assert trailing(call.trailing_metadata())["x-request-id"] == reply.request_id
        stored = harness.store.requests[reply.request_id]
        assert stored.tenant == "acme" and stored.query == query and stored.status is RequestStatus.DONE
        assert harness.store.decisions[reply.request_id].tier == tier
    requests = harness.metrics.registry.get_sample_value(
        "arag_frontdoor_requests_total", {"method": "Answer", "tier": "C", "code": "OK"})
    assert requests == 1.0
    for stage in ("authenticate", "classify", "record", "enqueue", "wait", "reply"):
        observed = harness.metrics.registry.get_sample_value(
            "arag_frontdoor_stage_seconds_count", {"method": "Answer", "stage": stage})
        assert observed == len(TIERS), stage


@pytest.mark.parametrize(("query", "reason"), [
    ("", CallError.QUERY_EMPTY),
    ("   \n ", CallError.QUERY_EMPTY),
    ("x" * 201, CallError.QUERY_TOO_LONG),
    (b"caf\xc3 lamp", CallError.QUERY_NOT_UTF8),
    ("lamp\x00 colour", CallError.QUERY_CONTROL_CHARACTER),
    ("lamp\x1b[31m", CallError.QUERY_CONTROL_CHARACTER),
])
def test_invalid_queries_get_invalid_argument_with_the_code_of_what_is_wrong(harness, query, reason):
    error = status_of(harness.answer, query)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and told(error, reason)
    assert harness.store.requests == {} and harness.queue.tasks == []


def test_bad_client_request_ids_are_invalid_arguments(harness):
    for value in ("", "a b", "k" * 129):
        error = status_of(harness.answer, "What is 2+2?", client_request_id=value)
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert told(error, CallError.INVALID_CLIENT_REQUEST_ID)


@pytest.mark.parametrize("metadata", [
    (), (("authorization", KEY),), (("authorization", "Bearer arag_not-a-key"),),
])
def test_missing_or_wrong_keys_are_unauthenticated(harness, metadata):
    error = status_of(harness.answer, "What is 2+2?", metadata=metadata)
    assert error.code() is grpc.StatusCode.UNAUTHENTICATED and told(error, CallError.UNAUTHENTICATED)
    assert KEY not in error.details()


def test_a_revoked_key_is_refused_once_the_revocation_watch_sees_the_key_table_change():
    h = Harness(make_settings(key_cache_s=600.0, key_revocation_s=0))  # the test runs the watch
    try:
        assert asyncio.run_coroutine_threadsafe(h.running.servicer.service.drop_revoked_keys(),
                                                h.loop).result(5)  # the first look drops all
        h.answer("What is 2+2?")  # the key is cached now
        h.store.revoke_key(KEY)
        assert h.answer("What is 2+2?")[0].answer  # the cache still holds it
        watch = asyncio.run_coroutine_threadsafe(h.running.servicer.service.drop_revoked_keys(), h.loop)
        assert watch.result(5)
        error = status_of(h.answer, "What is 2+2?")
        assert error.code() is grpc.StatusCode.UNAUTHENTICATED
        assert h.answer("What is 2+2?", metadata=OTHER_AUTH)[0].answer  # other keys: looked up again
        again = asyncio.run_coroutine_threadsafe(h.running.servicer.service.drop_revoked_keys(), h.loop)
        assert not again.result(5)  # nothing changed since: the cache is kept
    finally:
        h.close()


def test_repeated_client_request_id_replays_the_stored_reply(harness):
    first, _ = harness.answer("Who makes Lumora lamps?", client_request_id="order-1")
    again, call = harness.answer("Who makes Lumora lamps?", client_request_id="order-1")
    assert again.replayed and again.request_id == first.request_id
    assert again.answer == first.answer and again.tier == first.tier
    assert trailing(call.trailing_metadata())["x-request-id"] == first.request_id
    assert len(harness.queue.tasks) == 1
    # The key belongs to the tenant: another tenant's same key is a new request.
    other, _ = harness.stub.Answer.with_call(
        pb2.AnswerRequest(query=b"Who makes Lumora lamps?", client_request_id="order-1"),
        metadata=OTHER_AUTH)
    assert other.request_id != first.request_id and not other.replayed
    error = status_of(harness.answer, "What is 2+2?", client_request_id="order-1")
    assert error.code() is grpc.StatusCode.ALREADY_EXISTS and told(error, CallError.CLIENT_REQUEST_ID_REUSED)
    assert first.request_id in error.details()


def test_replay_of_a_request_still_running_waits_for_it():
    h = Harness(make_settings(), delay_s=0.8)
    try:
        replies = {}

        def send(name: str) -> None:
            replies[name] = h.answer("What is 2+2?", client_request_id="same", timeout=5)[0]

        first = threading.Thread(target=send, args=("first",))
        first.start()
        time.sleep(0.3)
        send("second")
        first.join()
        assert replies["second"].replayed and not replies["first"].replayed
        assert replies["second"].request_id == replies["first"].request_id
        assert replies["second"].answer == "answer to What is 2+2?"
        assert len(h.queue.tasks) == 1
    finally:
        h.close()


def test_deadline_exceeded_then_get_result_returns_the_answer():
    h = Harness(make_settings(deadline_margin_s=0.1), delay_s=1.2)
    try:
        started = time.monotonic()
        error = status_of(h.answer, "Which is older, X or Y?", timeout=0.6)
        assert time.monotonic() - started < 1.0
        assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        request_id = trailing(error.trailing_metadata())["x-request-id"]
        assert told(error, CallError.DEADLINE_EXCEEDED) and request_id in error.details()
        running = status_of(h.stub.GetResult, pb2.GetResultRequest(request_id=request_id), metadata=AUTH)
        assert running.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert told(running, CallError.NOT_FINISHED)
        time.sleep(1.0)
        reply = h.stub.GetResult(pb2.GetResultRequest(request_id=request_id), metadata=AUTH)
        assert reply.request_id == request_id and reply.replayed and reply.tier == pb2.TIER_C
        assert reply.answer == "answer to Which is older, X or Y?"
        assert reply.timings.total_ms == pytest.approx(
            reply.timings.classify_ms + reply.timings.queue_wait_ms + reply.timings.strategy_ms)
    finally:
        h.close()


def test_a_request_whose_message_was_lost_is_expired_by_the_sweep_and_the_resend_runs():
    h = Harness(make_settings(deadline_margin_s=0.1, queued_expiry_s=0.3, expiry_sweep_s=0.05))
    lost: list = []
    enqueue = h.queue.enqueue
    h.queue.enqueue = lambda task: lost.append(task) if not lost else enqueue(task)
    try:
        error = status_of(h.answer, "Which is older, X or Y?", client_request_id="c-lost", timeout=0.4)
        assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        request_id = trailing(error.trailing_metadata())["x-request-id"]
        deadline = time.monotonic() + 5
        while h.store.requests[request_id].status is not RequestStatus.EXPIRED:
            assert time.monotonic() < deadline, "the sweep never expired the request"
            time.sleep(0.05)
        never = status_of(h.stub.GetResult, pb2.GetResultRequest(request_id=request_id), metadata=AUTH)
        assert never.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert told(never, CallError.NEVER_RAN) and request_id in never.details()
        assert h.metrics.registry.get_sample_value("arag_requests_expired_total") == 1.0
        reply, _ = h.answer("Which is older, X or Y?", client_request_id="c-lost")
        assert reply.request_id == request_id and not reply.replayed and reply.answer
        assert h.metrics.registry.get_sample_value("arag_requests_expired_total") == 1.0
    finally:
        h.close()


def test_get_result_is_not_found_for_unknown_ids_and_other_tenants(harness):
    reply, _ = harness.answer("What is 2+2?")
    for request_id, metadata in [("0" * 32, AUTH), (reply.request_id, OTHER_AUTH)]:
        error = status_of(harness.stub.GetResult, pb2.GetResultRequest(request_id=request_id), metadata=metadata)
        assert error.code() is grpc.StatusCode.NOT_FOUND and told(error, CallError.REQUEST_NOT_FOUND)
    error = status_of(harness.stub.GetResult, pb2.GetResultRequest(request_id=" "), metadata=AUTH)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_full_queue_is_resource_exhausted_and_the_same_key_retries_later(harness):
    harness.queue.depths["tier-c"] = 3
    error = status_of(harness.answer, "Which is older, X or Y?", client_request_id="c-1")
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert told(error, CallError.QUEUE_FULL)
    request_id = trailing(error.trailing_metadata())["x-request-id"]
    assert harness.store.requests[request_id].status is RequestStatus.REJECTED
    assert harness.queue.tasks == []
    rejected = status_of(harness.stub.GetResult, pb2.GetResultRequest(request_id=request_id), metadata=AUTH)
    assert rejected.code() is grpc.StatusCode.FAILED_PRECONDITION and told(rejected, CallError.NEVER_RAN)
    # Tier A is not held back by C's backlog.
    assert harness.answer("What is 2+2?")[0].tier == pb2.TIER_A
    harness.queue.depths["tier-c"] = 0
    reply, _ = harness.answer("Which is older, X or Y?", client_request_id="c-1")
    assert reply.request_id == request_id and reply.answer
    assert harness.metrics.registry.get_sample_value("arag_frontdoor_rejected_total", {"tier": "C"}) == 1.0
    assert harness.metrics.registry.get_sample_value("arag_queue_depth", {"queue": "tier-c"}) == 0.0


def test_recorded_worker_errors_map_to_their_status():
    def fail(task):
        code = ErrorCode.DEPENDENCY_UNAVAILABLE if "llm" in task.query else ErrorCode.INTERNAL
        return AnswerResult(request_id=task.request_id, tier=task.tier, strategy=task.strategy,
                            error="LLMUnavailableError: endpoint refused", error_code=code)

    h = Harness(make_settings(), work=fail)
    try:
        error = status_of(h.answer, "llm down")
        assert error.code() is grpc.StatusCode.UNAVAILABLE and "endpoint refused" not in error.details()
        assert told(error, CallError.ANSWER_DEPENDENCY_UNAVAILABLE)
        request_id = trailing(error.trailing_metadata())["x-request-id"]
        stored = status_of(h.stub.GetResult, pb2.GetResultRequest(request_id=request_id), metadata=AUTH)
        assert stored.code() is grpc.StatusCode.UNAVAILABLE
        other = status_of(h.answer, "other failure")
        assert other.code() is grpc.StatusCode.INTERNAL and told(other, CallError.ANSWER_FAILED)
    finally:
        h.close()
    code, reason = status_for(AnswerFailedError("worker hit its time limit", ErrorCode.TIME_LIMIT))
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED and reason is CallError.ANSWER_TIME_LIMIT
    assert status_for(KeyError("a bug")) == (grpc.StatusCode.INTERNAL, CallError.INTERNAL)


def test_shadow_runs_go_to_the_neighbouring_tier_for_the_sampled_share():
    h = Harness(make_settings(shadow_share=0.5))
    try:
        h.samples[0] = 0.2  # inside the share
        for query in TIERS:
            h.answer(query)
        shadows = [(t.tier, t.strategy) for t in h.queue.tasks if t.kind is ResultKind.SHADOW]
        assert shadows == [("B", "single_step"), ("C", "evidence"), ("B", "single_step")]
        h.samples[0] = 0.7  # outside
        h.answer("What is 2+2?")
        assert sum(t.kind is ResultKind.SHADOW for t in h.queue.tasks) == 3
    finally:
        h.close()


def test_rules_fallback_is_flagged_in_the_reply_and_counted(harness):
    harness.router.fallback = True
    reply, _ = harness.answer("What is the difference between a lamp and a bulb?")
    assert reply.classifier.fallback and reply.tier == pb2.TIER_C
    assert reply.classifier.model_name == "rules" and reply.classifier.model_version == 0
    assert dict(reply.classifier.probabilities) == {}
    assert "rules fallback" in reply.classifier.reason
    decision = harness.store.decisions[reply.request_id]
    assert decision.fallback and decision.model_version is None
    assert harness.metrics.registry.get_sample_value("arag_classifier_fallback_total") == 1.0


def test_feedback_is_stored_for_the_tenants_own_requests(harness):
    reply, _ = harness.answer("What is 2+2?")
    ack = harness.stub.SubmitFeedback(
        pb2.FeedbackRequest(request_id=reply.request_id, rating=-1, correct_answer="Hello!", comment="terse"),
        metadata=AUTH)
    assert ack.feedback_id == 1
    assert harness.store.feedback == [{"request_id": reply.request_id, "rating": -1,
                                       "correct_answer": "Hello!", "comment": "terse"}]
    harness.stub.SubmitFeedback(pb2.FeedbackRequest(request_id=reply.request_id, rating=0), metadata=AUTH)
    assert harness.store.feedback[-1]["correct_answer"] is None
    bad = status_of(harness.stub.SubmitFeedback, pb2.FeedbackRequest(request_id=reply.request_id, rating=5),
                    metadata=AUTH)
    assert bad.code() is grpc.StatusCode.INVALID_ARGUMENT and told(bad, CallError.INVALID_FEEDBACK)
    for request_id, metadata in [("f" * 32, AUTH), (reply.request_id, OTHER_AUTH)]:
        missing = status_of(harness.stub.SubmitFeedback,
                            pb2.FeedbackRequest(request_id=request_id, rating=1), metadata=metadata)
        assert missing.code() is grpc.StatusCode.NOT_FOUND
    unauth = status_of(harness.stub.SubmitFeedback, pb2.FeedbackRequest(request_id=reply.request_id, rating=1))
    assert unauth.code() is grpc.StatusCode.UNAUTHENTICATED


def test_route_returns_the_recorded_decision_without_running_anything(harness):
    reply, call = harness.stub.Route.with_call(pb2.RouteRequest(query=b"Which is older, X or Y?"),
                                               metadata=AUTH)
    assert reply.tier == pb2.TIER_C and reply.strategy == "evidence"
    assert reply.classifier.model_name == "complexity" and reply.classifier.model_version == 1
    assert reply.classifier.probabilities["C"] == pytest.approx(0.8) and reply.classify_ms > 0
    assert trailing(call.trailing_metadata())["x-request-id"] == reply.decision_id
    assert harness.queue.tasks == []
    assert harness.store.requests[reply.decision_id].status is RequestStatus.ROUTED
    assert harness.store.decisions[reply.decision_id].tier == "C"
    assert harness.metrics.registry.get_sample_value(
        "arag_frontdoor_requests_total", {"method": "Route", "tier": "C", "code": "OK"}) == 1.0
    bad = status_of(harness.stub.Route, pb2.RouteRequest(query=b"\xff"), metadata=AUTH)
    assert bad.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(harness.stub.Route, pb2.RouteRequest(query=b"What is 2+2?")).code() is grpc.StatusCode.UNAUTHENTICATED


def test_health_checking_reports_serving(harness):
    health = health_pb2_grpc.HealthStub(harness.channel)
    for service in ("", SERVICE_NAME, KB_SERVICE_NAME, LIVENESS_SERVICE):
        response = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_and_describes_the_service(harness):
    stub = reflection_pb2_grpc.ServerReflectionStub(harness.channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME),
    ]
    listed, described = list(stub.ServerReflectionInfo(iter(requests)))
    names = {s.name for s in listed.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto.FromString(
        described.file_descriptor_response.file_descriptor_proto[0])
    assert proto.name == "adaptive_rag/v1/adaptive_rag.proto"
    assert [m.name for m in proto.service[0].method] == ["Answer", "GetResult", "SubmitFeedback", "Route"]
    assert KB_SERVICE_NAME in names


def test_logs_are_json_lines_carrying_request_id_and_tenant(harness):
    stream = io.StringIO()
    configure_logging("INFO", stream)
    try:
        reply, _ = harness.answer("What is 2+2?")
        status_of(harness.answer, "")
    finally:
        configure_logging("WARNING")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    rpc = [line for line in lines if line["event"] == "rpc"]
    assert rpc[0]["request_id"] == reply.request_id and rpc[0]["tenant"] == "acme"
    assert rpc[0]["code"] == "OK" and rpc[0]["tier"] == "A" and rpc[0]["method"] == "Answer"
    assert rpc[1]["code"] == "INVALID_ARGUMENT" and "request_id" not in rpc[1]
    assert any(line["event"] == "routed" and line["request_id"] == reply.request_id for line in lines)


def test_waiting_answers_do_not_hold_up_other_calls():
    h = Harness(make_settings(), delay_s=1.5)
    try:
        slow = threading.Thread(target=lambda: h.answer("Which is older, X or Y?", timeout=5))
        slow.start()
        time.sleep(0.3)  # an Answer is now waiting for its result
        started = time.monotonic()
        error = status_of(h.stub.GetResult, pb2.GetResultRequest(request_id="0" * 32), metadata=AUTH)
        assert error.code() is grpc.StatusCode.NOT_FOUND
        assert time.monotonic() - started < 0.5
        slow.join()
    finally:
        h.close()


# --- knowledge bases, scopes, fair share ----------------------------------------------------------

WRITER_KEY = "arag_writer-of-initech"
WRITER = (("authorization", f"Bearer {WRITER_KEY}"),)
INITECH_READER = (("authorization", "Bearer arag_reader-of-initech"),)


def test_a_tenant_brings_its_knowledge_base_through_the_api_and_can_then_ask(harness):
    harness.store.add_key(WRITER_KEY, "initech", frozenset({Scope.KB_WRITE}))
    harness.store.add_key("arag_reader-of-initech", "initech")
    missing = status_of(harness.answer, "What is 2+2?", metadata=INITECH_READER)
    assert missing.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert told(missing, CallError.KNOWLEDGE_BASE_MISSING) and harness.queue.tasks == []
    assert status_of(harness.kb.DescribeKnowledgeBase, pb2.DescribeKnowledgeBaseRequest(),
                     metadata=INITECH_READER).code() is grpc.StatusCode.FAILED_PRECONDITION
    docs = [pb2.Document(id="warranty", title="Warranty", text="Two years on every Initech stapler."),
            pb2.Document(id="setup", title="Setup", sections=[
                pb2.Section(heading="Unboxing", text="Remove the stapler from its box."),
                pb2.Section(heading="Loading", text="Open the top and insert staples.")])]
    reply = harness.kb.UpsertDocuments(pb2.UpsertDocumentsRequest(documents=docs), metadata=WRITER)
    assert (reply.added, reply.updated, reply.chunks_written) == (2, 0, 3)
    again = harness.kb.UpsertDocuments(pb2.UpsertDocumentsRequest(documents=docs), metadata=WRITER)
    assert (again.added, again.unchanged, again.chunks_written) == (0, 2, 0)
    chunks = harness.knowledge.index.chunks["initech"]
    assert {c.doc_id for c in chunks.values()} == {"warranty", "setup"}
    assert {c.section for c in chunks.values() if c.doc_id == "setup"} == {"Unboxing", "Loading"}
    info = harness.kb.DescribeKnowledgeBase(pb2.DescribeKnowledgeBaseRequest(), metadata=INITECH_READER)
    assert (info.documents, info.chunks, info.generation, info.backend) == (2, 3, 1, "fake") and info.updated_at
    # the knowledge base's own abstention threshold, derived on import
    assert info.abstain_threshold_source == "automatic" and info.HasField("automatic_abstain_threshold")
    assert info.abstain_threshold == info.automatic_abstain_threshold > 0
    assert harness.answer("What is 2+2?", metadata=INITECH_READER)[0].answer
    assert harness.queue.tasks[-1].tenant == "initech"
    streamed = harness.kb.StreamDocuments(iter(
        [pb2.Document(id=f"faq-{i}", title=f"Question {i}", text=f"Answer {i}.") for i in range(250)]),
        metadata=WRITER)
    assert streamed.added == 250
    deleted = harness.kb.DeleteDocuments(pb2.DeleteDocumentsRequest(document_ids=["setup", "nope"]),
                                         metadata=WRITER)
    assert (deleted.deleted, deleted.not_found, deleted.chunks_removed) == (1, 1, 2)
    assert not any(c.doc_id == "setup" for c in harness.knowledge.index.chunks["initech"].values())


def test_writes_need_the_write_scope_and_never_touch_another_tenant(harness):
    doc = pb2.Document(id="x", title="X", text="x")
    denied = status_of(harness.kb.UpsertDocuments, pb2.UpsertDocumentsRequest(documents=[doc]), metadata=AUTH)
    assert denied.code() is grpc.StatusCode.PERMISSION_DENIED and told(denied, CallError.PERMISSION_DENIED)
    assert status_of(harness.kb.DeleteDocuments, pb2.DeleteDocumentsRequest(document_ids=["welcome"]),
                     metadata=AUTH).code() is grpc.StatusCode.PERMISSION_DENIED
    harness.store.add_key(WRITER_KEY, "initech", frozenset({Scope.KB_WRITE}))
    gone = harness.kb.DeleteDocuments(pb2.DeleteDocumentsRequest(document_ids=["welcome"]), metadata=WRITER)
    assert (gone.deleted, gone.not_found) == (0, 1)  # acme's "welcome" is not initech's
    assert "welcome#0" in harness.knowledge.index.chunks["acme"]
    writer_cannot_answer = status_of(harness.answer, "What is 2+2?", metadata=WRITER)
    assert writer_cannot_answer.code() is grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("doc", [
    pb2.Document(id="", title="T", text="t"),
    pb2.Document(id="a#1", title="T", text="t"),
    pb2.Document(id="a", title="", text=""),
    pb2.Document(id="x" * 300, title="T", text="t"),
])
def test_bad_documents_are_invalid_arguments_and_change_nothing(harness, doc):
    harness.store.add_key(WRITER_KEY, "acme", frozenset({Scope.KB_WRITE}))
    good = pb2.Document(id="good", title="Good", text="fine")
    error = status_of(harness.kb.UpsertDocuments, pb2.UpsertDocumentsRequest(documents=[good, doc]), metadata=WRITER)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and told(error, CallError.INVALID_DOCUMENT)
    assert "good#0" not in harness.knowledge.index.chunks["acme"]


def test_a_tenant_over_its_share_gets_resource_exhausted_with_a_retry_after_hint():
    from services.frontdoor.fair_share import FairShareConfig, FairShareLimits, InMemoryFairShare

    limits = FairShareLimits(rate_per_s=0.0, burst=1, slots={"C": 1}, lease_s={"A": 60, "B": 60, "C": 60})
    h = Harness(make_settings(), delay_s=0.3, fair_share=InMemoryFairShare(FairShareConfig(limits)))
    try:
        results: dict[str, object] = {}

        def ask(name, metadata):
            try:
                results[name] = h.answer("Which is older, X or Y?", metadata=metadata)[0]
            except grpc.RpcError as exc:
                results[name] = exc

        first = threading.Thread(target=ask, args=("first", AUTH))
        first.start()
        time.sleep(0.1)  # acme's one tier-C slot is now held
        ask("second", AUTH)
        ask("other tenant", OTHER_AUTH)
        first.join(5)
        second = results["second"]
        assert isinstance(second, grpc.RpcError) and second.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert told(second, CallError.OVER_SHARE)
        assert 0 < float(trailing(second.trailing_metadata())["retry-after"]) <= 60
        assert results["first"].answer and results["other tenant"].answer  # globex is not held back
        assert h.answer("Which is older, X or Y?")[0].answer  # the slot came back with the answer
    finally:
        h.close()


def test_a_broker_that_is_away_is_unavailable_and_the_resend_runs(harness):
    from adaptive_rag.errors import DependencyUnavailableError

    harness.queue.down = DependencyUnavailableError("the task queue is unreachable (depth: ConnectionError)")
    error = status_of(harness.answer, "Which is older, X or Y?", client_request_id="c-down")
    assert error.code() is grpc.StatusCode.UNAVAILABLE and told(error, CallError.DEPENDENCY_UNAVAILABLE)
    assert "ConnectionError" not in error.details()
    request_id = trailing(error.trailing_metadata())["x-request-id"]
    assert harness.store.requests[request_id].status is RequestStatus.REJECTED
    harness.queue.down = None
    reply, _ = harness.answer("Which is older, X or Y?", client_request_id="c-down")
    assert reply.request_id == request_id and reply.answer


def test_readiness_is_not_serving_while_the_database_or_the_broker_is_away_liveness_stays():
    from adaptive_rag.errors import DependencyUnavailableError

    h = Harness(make_settings(), health_watch_s=0.05)
    try:
        health = health_pb2_grpc.HealthStub(h.channel)

        def status(service: str = SERVICE_NAME) -> int:
            return health.Check(health_pb2.HealthCheckRequest(service=service)).status

        def becomes(expected: int) -> bool:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if status() == expected and status("") == expected:
                    return True
                time.sleep(0.05)
            return False

        assert becomes(health_pb2.HealthCheckResponse.SERVING)
        h.queue.down = DependencyUnavailableError("broker away")
        assert becomes(health_pb2.HealthCheckResponse.NOT_SERVING)
        h.queue.down = None
        assert becomes(health_pb2.HealthCheckResponse.SERVING)
        h.store.down = ConnectionRefusedError("database away")
        assert becomes(health_pb2.HealthCheckResponse.NOT_SERVING)
        assert status(KB_SERVICE_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING
        # liveness: the process answers; restarting it would not bring the database back
        assert status(LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        h.store.down = None
        assert becomes(health_pb2.HealthCheckResponse.SERVING)
    finally:
        h.close()


def health_becomes(channel: grpc.Channel, expected: int, within_s: float = 5.0) -> bool:
    """Whether readiness (service "") reports `expected` within `within_s`."""
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME)).status == expected:
            return True
        time.sleep(0.05)
    return False


def test_health_is_not_serving_while_no_worker_answers_a_ping():
    alive: list[str] = ["tier-a@h", "tier-b@h", "tier-c@h"]
    h = Harness(make_settings(), health_watch_s=0.05, worker_probe=lambda: list(alive))
    try:
        def becomes(expected: int) -> bool:
            return health_becomes(h.channel, expected)

        assert becomes(health_pb2.HealthCheckResponse.SERVING)
        alive.clear()
        assert becomes(health_pb2.HealthCheckResponse.NOT_SERVING)
        alive.append("tier-c@h")  # one tier left: still serving (the others' queries wait)
        assert becomes(health_pb2.HealthCheckResponse.SERVING)
        gauge = h.metrics.registry.get_sample_value("arag_workers_alive", {"queue": "tier-a"})
        assert gauge == 0.0
        assert h.metrics.registry.get_sample_value("arag_workers_alive", {"queue": "tier-c"}) == 1.0
    finally:
        h.close()


def test_health_is_not_serving_while_the_llm_endpoint_is_not_ready():
    said: list[str | None] = ["LLM endpoint http://127.0.0.1:1/v1 not ready (HTTP 503)"]  # loading
    h = Harness(make_settings(), health_watch_s=0.05, worker_probe=lambda: ["tier-b@h"], llm_probe=lambda: said[0])
    try:
        def becomes(expected: int) -> bool:
            return health_becomes(h.channel, expected)

        assert becomes(health_pb2.HealthCheckResponse.NOT_SERVING)
        said[0] = None  # the model is loaded
        assert becomes(health_pb2.HealthCheckResponse.SERVING)
    finally:
        h.close()


def test_unavailable_carries_a_retry_after_hint(harness):
    from adaptive_rag.errors import DependencyUnavailableError

    harness.queue.down = DependencyUnavailableError("the task queue is unreachable (enqueue: ConnectionError)")
    error = status_of(harness.answer, "What is 2+2?")
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert trailing(error.trailing_metadata())["retry-after"] == "2.000"


def test_a_result_backend_that_stays_away_is_unavailable_not_internal(harness):
    from adaptive_rag.errors import DependencyUnavailableError

    class AwayWaiter:
        async def wait(self, task_id: str, timeout: float):
            raise DependencyUnavailableError(f"the result backend is unreachable; task {task_id} keeps running",
                                             reason=CallError.RESULT_STORE_UNAVAILABLE)

    harness.running.servicer.service.waiter = AwayWaiter()
    error = status_of(harness.answer, "Who makes Lumora lamps?")
    assert error.code() is grpc.StatusCode.UNAVAILABLE and told(error, CallError.RESULT_STORE_UNAVAILABLE)
    assert "retry-after" in trailing(error.trailing_metadata())


def test_wait_budgets_are_read_per_tier_and_negative_ones_refused(monkeypatch):
    from pydantic import ValidationError

    monkeypatch.setenv("ARAG_QUEUE_WAIT_TARGET", '{"A": 1.5, "C": 0}')
    monkeypatch.setenv("ARAG_QUEUE_WAIT_INTERVAL", "2")
    settings = FrontDoorSettings(_env_file=None)
    assert settings.queue_wait_target_s == {Tier.A: 1.5, Tier.C: 0.0} and settings.queue_wait_interval_s == 2.0
    monkeypatch.setenv("ARAG_QUEUE_WAIT_TARGET", '{"A": -1}')
    with pytest.raises(ValidationError, match="queue wait targets must be >= 0"):
        FrontDoorSettings(_env_file=None)


def test_the_blocking_calls_run_on_as_many_threads_as_configured(monkeypatch):
    monkeypatch.setenv("ARAG_FRONTDOOR_IO_THREADS", "2")
    h = Harness(make_settings())
    try:
        assert h.running.servicer.service._io_pool._max_workers == 2
        replies = [h.answer(q)[0] for q in ("Who makes Lumora lamps?", "Which is older, X or Y?")]
        assert [r.tier for r in replies] == [pb2.TIER_B, pb2.TIER_C]
    finally:
        h.close()
    monkeypatch.delenv("ARAG_FRONTDOOR_IO_THREADS")
    assert FrontDoorSettings(_env_file=None).io_threads == 4
