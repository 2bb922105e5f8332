"""A request accepted at the instant its front door dies is never stranded, with real parts: the
front door as its own process (`python -m services.frontdoor`), made to exit right after the
request's row is committed and before its task is enqueued (`ARAG_FAULT_EXIT_AFTER_RECORD`, a
test-only setting), then started again without it; a redis-server (broker, result backend, fair
share), PostgreSQL records, a real `celery worker` pool for tier A and the instant LLM endpoint:
the lab's stack (`lab.harness.stack`) without a front door of its own.

- the relay of the restarted front door publishes the stranded request: GetResult returns it
  DONE within 30 s of the restart, and its resend (same client_request_id) is answered;
- with the relay off, the resend itself publishes it and is answered;
- a replay that waits on work that cannot finish gets DEADLINE_EXCEEDED with the request id at
  the server's margin, like a new Answer, never the client's own deadline.
- a message the broker handed to a worker host that died before recording it (taken off its
  queue by hand here, as the dead host's BRPOP did) is published again by the front door once it
  is older than `ARAG_LOST_AFTER` and the broker holds it nowhere; a message still waiting on its
  queue is left alone.

Run: `.venv/bin/python -m pytest -q tests/integration/test_stranded_request.py`
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import redis

from adaptive_rag.contracts import CallError, RequestStatus
from adaptive_rag.knowledge.documents import Document, Section
from adaptive_rag.knowledge.service import open_knowledge_service
from adaptive_rag.storage import RecordStore
from lab.harness.instant_llm import LLM_ANSWER
from lab.harness.stack import LabStack, lab_stack
from services.demo.stack import FrontDoorProcess
from services.frontdoor.faults import FAULT_EXIT_STATUS
from services.frontdoor.stubs import pb2, pb2_grpc
from tests.support.pools import POOL_PARTS
from tests.support.redis import redis_db
from workers.celery_app import create_app
from workers.client import CeleryTaskQueue

pytestmark = pytest.mark.integration

QUERY = "capital of France"  # the rules route a short query to tier A: no retrieval, the instant LLM
SLOW_QUERY = "Compare the Lumora bulb versus the Lumora lamp"  # tier C: no pool runs it here
ANSWERED_WITHIN_S = 30.0  # the target: answered within 30 s of the restart
DEADLINE_S, MARGIN_S = 3.0, 0.5  # a client's deadline and the server's margin before it


@dataclass
class Stack:
    lab: LabStack
    key: str

    @property
    def settings(self):
        return self.lab.settings

    @property
    def store(self) -> RecordStore:
        return self.lab.store

    @property
    def logs(self) -> Path:
        return self.lab.core.logs

    def front_door(self, name: str, **env: str) -> tuple[FrontDoorProcess, pb2_grpc.AdaptiveRagStub, grpc.Channel]:
        process = self.lab.start_frontdoor(name, **env)
        channel = grpc.insecure_channel(process.listen)
        return process, pb2_grpc.AdaptiveRagStub(channel), channel

    @property
    def auth(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.key}"),)


@pytest.fixture(scope="module")
def stack(redis_url, postgres_url, tmp_path_factory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("stranded-request")
    settings = dict(database_url=postgres_url, redis_url=redis_db(redis_url, 12), llm_api="completions",
                    llm_max_retries=0, index_dir=workdir / "index", concurrency={"A": 1}, router="rules",
                    deadline_margin_s=MARGIN_S)
    with lab_stack(workdir, POOL_PARTS, pools=("A",), settings=settings, frontdoor=False, tenants=(),
                   dotenv=False) as lab:
        # The front door answers only a tenant with a knowledge base.
        open_knowledge_service(lab.settings.library, lab.store.engine).upsert("acme", [Document(
            "kb-1", "Lumora bulbs", (Section("Pairing", "Hold the button of a Lumora bulb for ten seconds."),))])
        yield Stack(lab, lab.api_key("acme"))


def dies_after_recording(stack: Stack, client_request_id: str) -> str:
    """Send an Answer to a front door that exits right after the request's row is committed;
    returns the request id the records hold for it (queued, never published)."""
    process, stub, channel = stack.front_door(f"dying-{client_request_id}", ARAG_FAULT_EXIT_AFTER_RECORD="1")
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.Answer(pb2.AnswerRequest(query_text=QUERY, client_request_id=client_request_id),
                        metadata=stack.auth, timeout=30)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE, info.value.details()
        assert process.process.wait(timeout=30) == FAULT_EXIT_STATUS
    finally:
        channel.close()
        process.stop()
    view = stack.store.find_request("acme", client_request_id)
    assert view is not None and view.status is RequestStatus.QUEUED and view.deliveries == 0
    return view.request_id


def answered_once(stack: Stack, request_id: str) -> None:
    """One result row, from one run: the task was published once after the crash."""
    view = stack.store.get_request(request_id)
    assert view.status is RequestStatus.DONE and view.deliveries == 1
    assert stack.store.count_results(request_id) == 1


def test_the_restarted_front_door_publishes_the_stranded_request_and_its_resend_is_answered(stack):
    client_request_id = f"stranded-{uuid.uuid4().hex[:8]}"
    request_id = dies_after_recording(stack, client_request_id)
    time.sleep(1.0)  # nothing else would ever publish it: still queued, nothing on the queue
    assert stack.store.get_request(request_id).status is RequestStatus.QUEUED
    assert CeleryTaskQueue(create_app(stack.settings.workers)).depth("tier-a") == 0
    process, stub, channel = stack.front_door("restarted")  # the relay on its defaults
    restarted = time.monotonic()
    try:
        get = pb2.GetResultRequest(request_id=request_id)
        while True:
            try:
                reply = stub.GetResult(get, metadata=stack.auth, timeout=10)
                break
            except grpc.RpcError as exc:
                assert exc.code() is grpc.StatusCode.FAILED_PRECONDITION, exc.details()
                assert dict(exc.trailing_metadata())["x-error-code"] == CallError.NOT_FINISHED, exc.details()
                assert time.monotonic() - restarted < ANSWERED_WITHIN_S, "not answered within 30 s of the restart"
                time.sleep(0.1)
        took = time.monotonic() - restarted
        print(f"\nstranded request answered {took:.2f} s after the front door's restart")
        assert reply.request_id == request_id and reply.answer == LLM_ANSWER.rstrip(".")
        resent = stub.Answer(pb2.AnswerRequest(query_text=QUERY, client_request_id=client_request_id),
                             metadata=stack.auth, timeout=DEADLINE_S)
        assert resent.request_id == request_id and resent.replayed and resent.answer == reply.answer
        answered_once(stack, request_id)
        assert "requests_republished" in (stack.logs / "restarted.log").read_text()
    finally:
        channel.close()
        process.stop()


def test_with_the_relay_off_the_resend_publishes_the_stranded_request_and_is_answered(stack):
    client_request_id = f"resent-{uuid.uuid4().hex[:8]}"
    request_id = dies_after_recording(stack, client_request_id)
    process, stub, channel = stack.front_door("no-relay", ARAG_RELAY_EVERY="0")
    try:
        time.sleep(1.2)  # older than a first admission's own publish could still be
        started = time.monotonic()
        resent = stub.Answer(pb2.AnswerRequest(query_text=QUERY, client_request_id=client_request_id),
                             metadata=stack.auth, timeout=ANSWERED_WITHIN_S)
        print(f"\nthe resend of a stranded request answered in {time.monotonic() - started:.2f} s")
        assert resent.request_id == request_id and resent.answer == LLM_ANSWER.rstrip(".")
        answered_once(stack, request_id)
        assert "resend_published" in (stack.logs / "no-relay.log").read_text()
    finally:
        channel.close()
        process.stop()


def test_a_replay_of_work_that_cannot_finish_ends_at_the_servers_margin_with_the_request_id(stack):
    process, stub, channel = stack.front_door("replay-deadline")
    try:
        ask = pb2.AnswerRequest(query_text=SLOW_QUERY, client_request_id=f"slow-{uuid.uuid4().hex[:8]}")
        took, ids = [], []
        for _ in range(2):  # the first Answer, then its resend (a replay waiting on the same run)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                stub.Answer(ask, metadata=stack.auth, timeout=DEADLINE_S)
            took.append(time.monotonic() - started)
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "keeps running" in info.value.details(), info.value.details()  # the server's, not the client's
            ids.append(dict(info.value.trailing_metadata())["x-request-id"])
        assert ids[0] == ids[1] and ids[0] in info.value.details()
        for seconds in took:
            assert DEADLINE_S - MARGIN_S - 0.3 < seconds < DEADLINE_S - 0.1, took
        assert stack.store.get_request(ids[0]).status is RequestStatus.QUEUED
    finally:
        channel.close()
        process.stop()
        for request_id in ids:  # the records are shared with the other modules: leave nothing queued
            stack.store.set_status(request_id, RequestStatus.EXPIRED)


def test_a_message_lost_on_the_way_to_a_dead_worker_is_published_again(stack):
    """Tier C has no pool here: its messages stay on `tier-c` until the test takes one."""
    process, stub, channel = stack.front_door("lost-check", ARAG_LOST_AFTER="2", ARAG_LOST_CHECK_EVERY="0.5")
    broker = redis.Redis.from_url(stack.settings.workers.redis_url)
    queue = CeleryTaskQueue(create_app(stack.settings.workers))
    broker.delete("tier-c")  # what the other tests' tier-C requests left (expired since)
    ids = []
    try:
        for n in range(2):
            with pytest.raises(grpc.RpcError) as info:
                stub.Answer(pb2.AnswerRequest(query_text=SLOW_QUERY, client_request_id=f"lost-{n}-{uuid.uuid4().hex[:6]}"),
                            metadata=stack.auth, timeout=DEADLINE_S)
            assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            ids.append(dict(info.value.trailing_metadata())["x-request-id"])
        assert queue.held(ids) == set(ids) and queue.depth("tier-c") == 2
        taken = broker.rpop("tier-c")  # the dead host's BRPOP: the older message, never recorded
        lost, waiting = (ids[0], ids[1]) if ids[0].encode() in taken else (ids[1], ids[0])
        assert queue.held(ids) == {waiting}
        took_at = time.monotonic()
        while queue.held([lost]) != {lost}:
            assert time.monotonic() - took_at < 15, "the lost message was not published again"
            time.sleep(0.2)
        print(f"\na message lost in transit published again {time.monotonic() - took_at:.1f} s after it was taken")
        time.sleep(1.5)  # a few more checks: nothing is published twice
        assert queue.depth("tier-c") == 2 and queue.held(ids) == set(ids)
        assert (stack.logs / "lost-check.log").read_text().count("lost_messages_republished") == 1
        view = stack.store.get_request(lost)
        assert view.status is RequestStatus.QUEUED and view.deliveries == 0
    finally:
        channel.close()
        process.stop()
        broker.delete("tier-c")
        for request_id in ids:  # the records are shared with the other modules: leave nothing queued
            stack.store.set_status(request_id, RequestStatus.EXPIRED)
