"""The whole serving path with real parts: the front door (`python -m services.frontdoor`) on
loopback gRPC, real Redis (broker + result backend), real PostgreSQL (records), real Celery worker
pools (`workers.pools`, embedded Gemma model + tantivy index of the demo help center) and the real
Triton (`serve.py` from nvidia-pytriton). The stack is the lab's (`lab.harness.stack`), started
by `tests/e2e/conftest.py`.

The classifier served is a real ONNX graph with a rule the test can rely on: logits from the
token count (short -> A, medium -> B, long -> C), with the MiniLM tokenizer. A trained model's
routing of any given question can change with every retraining; this test is about serving.

Every test sets up what it needs and leaves the module's stack as it found it, so any one of them
passes alone (`-k NAME`) and in any order: the tests that publish a new model version or stop
Triton do it on a front door and Triton of their own (`own_frontdoor`).

Run: `.venv/bin/python -m pytest -q tests/e2e/test_frontdoor_e2e.py`
"""

from __future__ import annotations

import json
import re
import uuid

import grpc
import pytest
import redis
from e2e_stack import C_QUEUE_LIMIT, Stack, publish_version
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import func, select

from adaptive_rag.contracts import CALL_ERROR_MESSAGES, CallError
from adaptive_rag.routing.classifier_client import QueryTokenizer
from adaptive_rag.storage import ApiKey, Feedback, QueryRequest, QueryResult, RoutingDecision
from services.frontdoor.stubs import SERVICE_NAME, pb2

pytestmark = [pytest.mark.integration, pytest.mark.model]

QUERIES = {
    "A": "What is 2+2?",
    "B": "How long is the Lumora Hub H2 warranty?",
    "C": "What is the maximum brightness of the A19 Color bulb and of the Flex Strip starter kit?",
}
STRATEGY = {"A": "no_retrieval", "B": "single_step", "C": "evidence"}
TIER_ENUM = {"A": pb2.TIER_A, "B": pb2.TIER_B, "C": pb2.TIER_C}


def test_queries_have_the_lengths_the_length_router_needs(model_repository) -> None:
    tokenize = QueryTokenizer(model_repository / "complexity" / "1" / "tokenizer.json", 64)
    lengths = {tier: int(tokenize([q])[1].sum()) for tier, q in QUERIES.items()}
    assert lengths["A"] <= 8 and 10 <= lengths["B"] <= 19 and lengths["C"] >= 21, lengths


def json_logs(stack: Stack) -> list[dict]:
    return [json.loads(line) for line in stack.log_path.read_text().splitlines() if line.startswith("{")]


def count(stack: Stack, model, **where) -> int:
    with stack.store.engine.connect() as conn:
        query = select(func.count()).select_from(model)
        for column, value in where.items():
            query = query.where(getattr(model, column) == value)
        return conn.scalar(query)


def test_health_and_one_query_of_each_tier_with_rows_in_every_table(stack):
    # Answers wait for results on one Redis pub/sub connection (no thread per waiting Answer).
    with redis.Redis.from_url(stack.settings.workers.redis_url) as client:
        patterns = client.pubsub_numpat()
    assert patterns >= 1
    health = health_pb2_grpc.HealthStub(stack.channel)
    assert health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME)).status == \
        health_pb2.HealthCheckResponse.SERVING
    for tier, query in QUERIES.items():
        reply, call = stack.answer(query)
        assert reply.tier == TIER_ENUM[tier] and reply.strategy == STRATEGY[tier]
        assert not reply.replayed and reply.answer.strip()
        assert not reply.classifier.fallback
        assert reply.classifier.model_name == "complexity" and reply.classifier.model_version == 1
        assert max(reply.classifier.probabilities, key=reply.classifier.probabilities.get) == tier
        assert reply.steps >= (0 if tier == "A" else 1)
        assert (len(reply.sources) > 0) == (tier != "A")
        timings = reply.timings
        assert timings.total_ms >= timings.strategy_ms > 0 and timings.classify_ms > 0
        assert timings.queue_wait_ms >= 0
        assert dict(call.trailing_metadata())["x-request-id"] == reply.request_id
        request = stack.store.get_request(reply.request_id)
        assert request.tenant == "acme" and request.status == "done" and request.query == query
        decision = stack.store.decision_for(reply.request_id)
        assert (decision.tier, decision.model_version, decision.fallback) == (tier, 1, False)
        result = stack.store.get_result(reply.request_id)
        assert result.answer == reply.answer and result.tier == tier and result.error is None
        ack = stack.stub.SubmitFeedback(
            pb2.FeedbackRequest(request_id=reply.request_id, rating=1, comment=f"tier {tier} ok"),
            metadata=stack.auth)
        assert ack.feedback_id > 0
    for model in (ApiKey, QueryRequest, RoutingDecision, QueryResult, Feedback):
        assert count(stack, model) >= (1 if model is ApiKey else 3), model.__tablename__


def test_repeated_client_request_id_replays_without_running_again(stack):
    client_id = f"e2e-replay-{uuid.uuid4().hex[:8]}"
    first, _ = stack.answer(QUERIES["A"], client_request_id=client_id)
    again, _ = stack.answer(QUERIES["A"], client_request_id=client_id)
    assert not first.replayed
    assert again.replayed and again.request_id == first.request_id and again.answer == first.answer
    assert stack.store.count_results(first.request_id) == 1
    assert count(stack, QueryRequest, client_request_id=client_id) == 1


def test_route_classifies_with_the_served_model_and_records_the_decision(stack):
    """The decision-only RPC: Triton decides, the decision is recorded, no worker runs anything."""
    for tier, query in QUERIES.items():
        reply = stack.stub.Route(pb2.RouteRequest(query=query.encode()), metadata=stack.auth, timeout=30)
        assert reply.tier == TIER_ENUM[tier] and reply.strategy == STRATEGY[tier]
        assert not reply.classifier.fallback and reply.classifier.model_version == 1
        assert sum(reply.classifier.probabilities.values()) == pytest.approx(1.0, abs=1e-4)
        request = stack.store.get_request(reply.decision_id)
        assert request is not None and request.status == "routed" and request.query == query
        decision = stack.store.decision_for(reply.decision_id)
        assert decision.tier == tier and decision.model_version == 1
        assert stack.store.count_results(reply.decision_id) == 0
    ack = stack.stub.SubmitFeedback(pb2.FeedbackRequest(request_id=reply.decision_id, rating=1),
                                    metadata=stack.auth, timeout=30)
    assert ack.feedback_id > 0


def test_short_deadline_then_get_result(stack):
    client_id = f"e2e-deadline-{uuid.uuid4().hex[:8]}"
    with pytest.raises(grpc.RpcError) as info:
        stack.answer(QUERIES["C"], timeout=1.5, client_request_id=client_id)
    error = info.value
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    request_id = stack.store.find_request("acme", client_id).request_id
    assert request_id in error.details()  # our reply, sent before the client's own deadline
    still = pytest.raises(grpc.RpcError, stack.get_result, request_id)
    assert still.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    reply = stack.wait_for_result(request_id)
    assert reply.request_id == request_id and reply.replayed and reply.tier == pb2.TIER_C
    assert reply.answer.strip() and stack.store.count_results(request_id) == 1


@pytest.mark.parametrize(("query", "reason"), [
    ("", CallError.QUERY_EMPTY),
    ("x" * 501, CallError.QUERY_TOO_LONG),
    (b"warranty \xff\xfe", CallError.QUERY_NOT_UTF8),
    ("warranty\x07?", CallError.QUERY_CONTROL_CHARACTER),
])
def test_invalid_queries(stack, query, reason):
    with pytest.raises(grpc.RpcError) as info:
        stack.answer(query, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == CALL_ERROR_MESSAGES[reason]
    assert dict(info.value.trailing_metadata())["x-error-code"] == reason


def test_unauthenticated_and_not_found(stack):
    for auth in ((), (("authorization", "Bearer arag_wrong"),)):
        with pytest.raises(grpc.RpcError) as info:
            stack.answer("hi", timeout=10, auth=auth)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as info:
        stack.get_result("0" * 32)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stack.stub.SubmitFeedback(pb2.FeedbackRequest(request_id="0" * 32, rating=-1),
                                  metadata=stack.auth, timeout=10)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when the series is not there yet)."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    series = f"{name}{{{inner}}}" if labels else name
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_full_tier_queue_is_resource_exhausted_while_other_tiers_answer(stack):
    run = uuid.uuid4().hex[:8]
    exhausted = ("arag_frontdoor_requests_total",
                 {"code": "RESOURCE_EXHAUSTED", "method": "Answer", "tier": "C"})
    before = metric(stack.metrics(), exhausted[0], **exhausted[1])
    stack.pools.kill("C")  # nobody consumes tier-c: its queue grows
    waiting = []
    try:
        for i in range(C_QUEUE_LIMIT):
            with pytest.raises(grpc.RpcError) as info:
                stack.answer(QUERIES["C"], timeout=1.0, client_request_id=f"e2e-backlog-{run}-{i}")
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            waiting.append(stack.store.find_request("acme", f"e2e-backlog-{run}-{i}").request_id)
        with pytest.raises(grpc.RpcError) as info:
            stack.answer(QUERIES["C"], timeout=10, client_request_id=f"e2e-rejected-{run}")
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(info.value.trailing_metadata())["x-error-code"] == CallError.QUEUE_FULL
        assert stack.store.find_request("acme", f"e2e-rejected-{run}").status == "rejected"
        assert metric(stack.metrics(), exhausted[0], **exhausted[1]) == before + 1
        reply, _ = stack.answer(QUERIES["A"])  # tier A is not held back by C's backlog
        assert reply.tier == pb2.TIER_A
    finally:
        stack.pools.start_pool("C")
    for request_id in waiting:  # the queued work was kept and runs once C is back
        assert stack.wait_for_result(request_id).answer.strip()


def test_prometheus_metrics(stack):
    ok = {"code": "OK", "method": "Answer"}
    before = stack.metrics()
    for tier in ("A", "B"):
        reply, _ = stack.answer(QUERIES[tier])
        assert reply.tier == TIER_ENUM[tier]
    text = stack.metrics()
    for tier in ("A", "B"):
        assert metric(text, "arag_frontdoor_requests_total", tier=tier, **ok) == \
            metric(before, "arag_frontdoor_requests_total", tier=tier, **ok) + 1, tier
    bucket = {"code": "OK", "le": "+Inf", "method": "Answer", "tier": "A"}
    assert metric(text, "arag_frontdoor_request_seconds_bucket", **bucket) == \
        metric(before, "arag_frontdoor_request_seconds_bucket", **bucket) + 1
    assert 'arag_queue_depth{queue="tier-c"}' in text
    assert metric(text, "arag_classifier_model_version", model="complexity") == 1.0


# Long enough for C under version 1 (from 21 tokens), one question (two go to C whatever the model).
LONG_QUESTION = "What is the maximum brightness in lumens that the A19 Color bulb reaches at its warmest white color setting?"


def test_a_newly_published_version_is_used_without_a_restart(own_frontdoor):
    door = own_frontdoor()  # its own model repository and Triton: the module's stack stays on v1
    repository, triton = door.extra["model_repository"], door.extra["triton"]
    reply, _ = door.answer(LONG_QUESTION)
    assert reply.tier == pb2.TIER_C and reply.classifier.model_version == 1
    # Version 2 sends long questions to B (C only from 41 tokens); Triton restarts on the same
    # port serving it, as a deployment rolling out a new model version would.
    publish_version(repository, 2, c_bias=-40.0)
    port = triton.grpc_port
    triton.stop()
    new_triton = door.lab.start_triton(f"triton-v2-{port}", repository, grpc_port=port)
    try:
        door.wait_for_model_version(2, within_s=60)
        reply, _ = door.answer(LONG_QUESTION)
        assert reply.tier == pb2.TIER_B and reply.classifier.model_version == 2
        assert not reply.classifier.fallback
        decision = door.store.decision_for(reply.request_id)
        assert (decision.tier, decision.model_version) == ("B", 2)
    finally:
        new_triton.stop()


def test_rules_fallback_when_triton_is_stopped(own_frontdoor):
    door = own_frontdoor()  # stopping its Triton leaves the module's stack untouched
    door.extra["triton"].stop()
    reply, _ = door.answer("What is 2+2?")
    assert reply.classifier.fallback and reply.classifier.model_name == "rules"
    assert reply.classifier.model_version == 0 and "rules fallback" in reply.classifier.reason
    assert reply.tier == pb2.TIER_B and reply.answer.strip()  # the rules send questions to B
    decision = door.store.decision_for(reply.request_id)
    assert decision.fallback and decision.probabilities is None and decision.model_version is None
    assert metric(door.metrics(), "arag_classifier_fallback_total") >= 1
    routed = [line for line in json_logs(door) if line.get("event") == "routed" and line.get("request_id") == reply.request_id]
    assert routed and routed[0]["fallback"] is True and routed[0]["tenant"] == "acme"


def test_small_talk_is_answered_briefly_at_admission_without_the_classifier_or_a_worker(stack: Stack) -> None:
    reply, _ = stack.answer("hi there!")
    assert (reply.tier, reply.strategy, reply.steps) == (pb2.TIER_A, "small_talk", 0)
    assert reply.classifier.model_name == "small_talk" and reply.classifier.reason == "small talk (greeting)"
    assert reply.answer.startswith("Hello") and not reply.sources and reply.answerable
    stored = stack.store.stored_result(reply.request_id)  # recorded like any answer, by the front door
    assert stored is not None and stored.worker == "frontdoor" and stored.result.answer == reply.answer
    assert stack.store.get_request(reply.request_id).status.value == "done"


def test_a_follow_up_in_a_conversation_is_rewritten_and_answered_with_its_sources(stack: Stack) -> None:
    first, _ = stack.answer("What does the Lumora Plus plan include?")
    assert first.conversation_id == first.request_id
    follow, _ = stack.answer("how do I cancel it?", conversation_id=first.conversation_id)
    assert follow.conversation_id == first.conversation_id
    assert (follow.rewritten_query, follow.rewrite) == ("How do I cancel the Lumora Plus plan?", "rules")
    view = stack.store.get_request(follow.request_id)
    assert (view.query, view.standalone_query) == ("how do I cancel it?", follow.rewritten_query)
    if follow.tier != pb2.TIER_A and follow.answerable:  # a support answer cites a source it used
        assert follow.sources and re.search(r"\[\d\]", follow.answer)


def test_a_conversation_of_no_one_is_not_found_and_a_malformed_one_invalid(stack: Stack) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        stack.answer("and the Pro plan?", conversation_id="f" * 32)
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as malformed:
        stack.answer("and the Pro plan?", conversation_id="not an id")
    assert malformed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
