"""No request left queued forever, and no task killing its worker forever, with real parts: a
redis-server (broker and result backend), PostgreSQL records, real `celery worker` pools started
by `workers.pools` under their supervisor, the real gRPC front door with its expiry sweep, and the
instant LLM endpoint (`lab/harness/instant_llm.py`) instead of the embedded model; the lab's stack
(`lab.harness.stack`) without a front door of its own.

Run: `.venv/bin/python -m pytest -q tests/integration/test_request_lifecycle.py`
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import update

from adaptive_rag.contracts import (
    CALL_ERROR_MESSAGES, AnswerResult, AnswerTask, CallError, ErrorCode, RequestStatus, RoutingDecision, Tier,
)
from adaptive_rag.storage import QueryRequest, RecordStore
from lab.harness.instant_llm import LLM_ANSWER
from lab.harness.stack import lab_stack
from tests.support.frontdoor import in_process_front_door
from tests.support.pools import POOL_PARTS, QUERY, PoolStack, answered, send, submit
from tests.support.redis import redis_db
from workers.celery_app import create_app
from workers.client import CeleryTaskQueue, open_result_waiter
from workers.pools import RestartPolicy, WorkerPools

pytestmark = pytest.mark.integration

LLM_LATENCY_MS = 4000.0  # each answer takes 4 s: a run is still going when its worker is killed
MAX_DELIVERIES = 2
ANSWER_S = 90.0  # generous: two shared cores, another job beside the tests


@pytest.fixture(scope="module")
def stack(redis_url, postgres_url, tmp_path_factory) -> Iterator[PoolStack]:
    """Pool A (one prefork process, supervised: restarted at once and its reserved messages put
    back when it dies); pool B is started by the test that needs it."""
    settings = dict(database_url=postgres_url, redis_url=redis_db(redis_url, 7), llm_api="completions",
                    llm_max_retries=0, task_max_retries=1, task_retry_backoff_s=0.2, concurrency={"A": 1, "B": 1},
                    prefetch={"A": 1, "B": 1}, task_max_deliveries=MAX_DELIVERIES)
    with lab_stack(tmp_path_factory.mktemp("request-lifecycle"), POOL_PARTS, pools=("A",), settings=settings,
                   llm_latency_ms=LLM_LATENCY_MS, frontdoor=False, tenants=(), dotenv=False,
                   supervise=RestartPolicy(first_backoff_s=0.2), supervise_poll_s=0.2) as lab:
        yield PoolStack.of(lab)


def recorded(store: RecordStore, request_id: str, timeout: float = ANSWER_S) -> AnswerResult:
    return answered(store, [request_id], timeout)[0]


def wait_until(check, what: str, timeout: float = ANSWER_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.1)


def events(log: Path, name: str) -> list[dict[str, Any]]:
    """The worker's JSON log events called `name`."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and name in line:
            event = json.loads(line)
            if event.get("event") == name:
                found.append(event)
    return found


# --- the redelivery cap ------------------------------------------------------------------------------

def test_a_task_whose_request_shows_deliveries_at_the_cap_ends_as_an_internal_error_unrun(stack):
    request_id = uuid.uuid4().hex
    stack.store.create_request(request_id, "acme", None, QUERY, decision=RoutingDecision(
        tier=Tier.A, fallback=True, reason="test", strategy="no_retrieval"))
    with stack.store.engine.begin() as conn:  # two deliveries began it and never came back
        conn.execute(update(QueryRequest).where(QueryRequest.request_id == request_id)
                     .values(deliveries=MAX_DELIVERIES))
    task = send(stack, request_id)
    result = recorded(stack.store, request_id)
    assert result.error_code is ErrorCode.INTERNAL and result.answer is None
    assert result.error == f"the task killed its worker {MAX_DELIVERIES} times before it could finish; not run again"
    assert result.timings.strategy_ms < 1000  # the 4 s LLM call never happened
    log = stack.pools.pools["A"].log_path
    assert not [e for e in events(log, "task.started") if e["request_id"] == request_id]
    assert [e for e in events(log, "task.redelivery_cap") if e["request_id"] == request_id]
    view = stack.store.get_request(request_id)
    assert view.status is RequestStatus.ERROR and view.deliveries == MAX_DELIVERIES + 1
    assert stack.store.count_results(request_id) == 1

    async def wait_via_redis() -> AnswerResult:  # what a waiting front door gets
        waiter = open_result_waiter(stack.app())
        await waiter.start()
        try:
            return await waiter.wait(task.task_id, 10.0)
        finally:
            await waiter.close()

    assert asyncio.run(wait_via_redis()) == result


def test_a_task_that_keeps_killing_its_whole_worker_is_stopped_after_the_cap(stack):
    """SIGKILL the pool's main process (the OOM killer's way) while the task runs, every time it
    runs: the supervisor restarts the pool and puts the message back, and after MAX_DELIVERIES
    runs the next delivery records an `internal` error instead of running a third time."""
    task = submit(stack)
    for kill in range(1, MAX_DELIVERIES + 1):
        wait_until(lambda: stack.store.get_request(task.request_id).deliveries == kill
                   and stack.store.get_request(task.request_id).status == "running",
                   f"delivery {kill} began")
        restarts = stack.pools.restarts["A"]
        os.kill(stack.pools.pools["A"].pid, signal.SIGKILL)
        wait_until(lambda: stack.pools.restarts["A"] > restarts, "pool A restarted")
    result = recorded(stack.store, task.request_id)
    assert result.error_code is ErrorCode.INTERNAL, result
    assert f"killed its worker {MAX_DELIVERIES} times" in result.error
    view = stack.store.get_request(task.request_id)
    assert view.status is RequestStatus.ERROR and view.deliveries == MAX_DELIVERIES + 1
    assert view.runs == MAX_DELIVERIES + 1  # every run begun, the one refused at the cap too
    assert stack.store.count_results(task.request_id) == 1
    assert stack.pools.health["A"].exit_codes[-MAX_DELIVERIES:] == [-signal.SIGKILL] * MAX_DELIVERIES
    stack.pools.wait_ready("A")
    after = submit(stack)  # the pool serves the next one as usual
    assert recorded(stack.store, after.request_id).answer == LLM_ANSWER.rstrip(".")


# --- expired requests --------------------------------------------------------------------------------

def test_a_worker_reaching_an_expired_requests_message_acknowledges_it_without_running(stack, tmp_path):
    """Tier B has no pool yet: its message waits while the request expires. The pool then
    reaches the message, does not run it and acknowledges it; after a resend it runs."""
    task = submit(stack, Tier.B, "no_retrieval")
    queue = CeleryTaskQueue(stack.app())
    assert queue.depth("tier-b") == 1
    assert stack.store.expire_queued(0.0) == [task.request_id]
    pools = WorkerPools(stack.workers, pools=("B",), library=stack.library, log_dir=tmp_path, migrate=False)
    with pools:
        log = pools.pools["B"].log_path
        wait_until(lambda: events(log, "task.not_runnable"), "the worker reached the message")
        [skipped] = events(log, "task.not_runnable")
        assert (skipped["request_id"], skipped["status"]) == (task.request_id, "expired")
        wait_until(lambda: queue.depth("tier-b") == 0, "the message was consumed")
        with stack.app().connection_for_write() as connection:  # acknowledged, not just reserved
            channel = connection.default_channel
            wait_until(lambda: channel.client.hlen(channel.unacked_key) == 0, "the message was acknowledged", 10)
        time.sleep(1.0)
        assert stack.store.get_request(task.request_id).status is RequestStatus.EXPIRED
        assert stack.store.count_results(task.request_id) == 0 and not events(log, "task.started")
        assert app_state_of(stack.app(), task.request_id) == "PENDING"  # nothing stored for waiters
        # The client resends it: the request is queued again and runs under its request id.
        assert stack.store.readmit(task.request_id)
        send(stack, task.request_id, Tier.B, "no_retrieval")
        result = recorded(stack.store, task.request_id)
    assert result.ok and result.answer == LLM_ANSWER.rstrip(".")
    assert stack.store.get_request(task.request_id).status is RequestStatus.DONE


# --- the front door ----------------------------------------------------------------------------------

class LosingFirstMessage:
    """The real task queue, except that the first message it is given is lost on the way."""

    def __init__(self, queue: CeleryTaskQueue) -> None:
        self.queue = queue
        self.lost: list[AnswerTask] = []

    def enqueue(self, task: AnswerTask) -> None:
        if not self.lost:
            self.lost.append(task)
            return
        self.queue.enqueue(task)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)


def rpc_error(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


def test_a_lost_message_expires_in_the_sweep_and_the_resend_runs_under_its_request_id(stack):
    app = stack.app()
    queue = LosingFirstMessage(CeleryTaskQueue(app))
    with in_process_front_door(stack.store, stack.library, queue, app, queued_expiry_s=2.0,
                               expiry_sweep_s=0.2) as client:
        pb2, cid = client.pb2, f"lost-{uuid.uuid4().hex[:8]}"
        ask = pb2.AnswerRequest(query_text=QUERY, client_request_id=cid)
        error = rpc_error(client.stub.Answer, ask, metadata=client.auth, timeout=1.5)
        assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        request_id = dict(error.trailing_metadata())["x-request-id"]
        assert [t.request_id for t in queue.lost] == [request_id]
        get = pb2.GetResultRequest(request_id=request_id)
        waiting = rpc_error(client.stub.GetResult, get, metadata=client.auth)
        assert dict(waiting.trailing_metadata())["x-error-code"] == CallError.NOT_FINISHED
        wait_until(lambda: stack.store.get_request(request_id).status == "expired", "the sweep expired it", 30)
        never = rpc_error(client.stub.GetResult, get, metadata=client.auth)
        assert never.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert dict(never.trailing_metadata())["x-error-code"] == CallError.NEVER_RAN
        assert never.details() == f"{CALL_ERROR_MESSAGES[CallError.NEVER_RAN]} (request {request_id})"
        assert client.metrics.registry.get_sample_value("arag_requests_expired_total") == 1.0
        reply = client.stub.Answer(ask, metadata=client.auth, timeout=ANSWER_S)
        assert reply.request_id == request_id and not reply.replayed
        assert reply.answer == LLM_ANSWER.rstrip(".")
        assert stack.store.get_request(request_id).status is RequestStatus.DONE
        assert stack.store.count_results(request_id) == 1


def test_a_run_that_failed_for_a_dependency_runs_again_when_resent(redis_url, postgres_url, tmp_path):
    """The LLM endpoint is down: the run ends `dependency_unavailable` (UNAVAILABLE). Once it is
    up, the resend of the same client_request_id runs again under the same request id: its old
    error answers neither the records (one row) nor the Redis result the front door waits on."""
    settings = dict(database_url=postgres_url, redis_url=redis_db(redis_url, 8), llm_api="completions",
                    llm_max_retries=0, llm_timeout_s=5.0, task_max_retries=0, concurrency={"A": 1})
    with lab_stack(tmp_path, POOL_PARTS, pools=("A",), settings=settings, frontdoor=False, tenants=(),
                   dotenv=False) as lab:
        lab.llm.stop()  # down before the first call; started again on its port below
        store, app = lab.store, create_app(lab.settings.workers)
        with in_process_front_door(store, lab.settings.library, CeleryTaskQueue(app), app,
                                   expiry_sweep_s=0) as client:
            ask = client.pb2.AnswerRequest(query_text=QUERY, client_request_id=f"dep-{uuid.uuid4().hex[:8]}")
            error = rpc_error(client.stub.Answer, ask, metadata=client.auth, timeout=ANSWER_S)
            assert error.code() is grpc.StatusCode.UNAVAILABLE, error.details()
            assert dict(error.trailing_metadata())["x-error-code"] == CallError.ANSWER_DEPENDENCY_UNAVAILABLE
            assert "send the Answer again with the same client_request_id" in error.details()
            request_id = dict(error.trailing_metadata())["x-request-id"]
            assert store.get_result(request_id).error_code is ErrorCode.DEPENDENCY_UNAVAILABLE
            assert app_state_of(app, request_id) == "SUCCESS"  # the error result, in Redis
            lab.llm.start()
            reply = client.stub.Answer(ask, metadata=client.auth, timeout=ANSWER_S)
            assert reply.request_id == request_id and not reply.replayed
            assert reply.answer == LLM_ANSWER.rstrip(".")
            view = store.get_request(request_id)
            assert view.status is RequestStatus.DONE
            assert store.count_results(request_id) == 1 and store.get_result(request_id).ok
            # one result row, two runs: the failed one's row was replaced, its run still counts
            assert (view.runs, view.deliveries) == (2, 1)
            again = client.stub.Answer(ask, metadata=client.auth, timeout=ANSWER_S)
            assert again.replayed and again.answer == reply.answer


def app_state_of(app, task_id: str) -> str:
    return app.AsyncResult(task_id).state
