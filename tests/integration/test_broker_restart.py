"""The broker restarting under load, with real parts: a redis-server with its append-only file
(`infra.local.servers.LocalRedis`, stopped and started again on the same port), PostgreSQL
records, real `celery worker` pools started by `workers.pools`, the real gRPC front door, and the
instant LLM endpoint (`lab/harness/instant_llm.py`, a fixed wait per completion) so that tasks are
in flight when Redis goes away without the embedded model's cost. The stack is the lab's
(`lab.harness.stack`), its Redis its own.

Run: `.venv/bin/python -m pytest -q tests/integration/test_broker_restart.py`
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import kombu
import pytest
import redis

from adaptive_rag.contracts import AnswerResult
from adaptive_rag.errors import DependencyUnavailableError
from infra.local.servers import LocalRedis
from lab.harness.instant_llm import LLM_ANSWER
from lab.harness.stack import lab_stack
from tests.support.frontdoor import in_process_front_door
from tests.support.pools import POOL_PARTS, PoolStack, answered, submit
from workers.client import CeleryTaskQueue, RedisResultWaiter, open_result_waiter
from workers.pools import RestartPolicy

pytestmark = pytest.mark.integration

LLM_LATENCY_MS = 2000.0  # each answer takes 2 s: tasks are running when Redis restarts
DOWN_S = 3.0  # how long Redis stays away in each restart
ANSWER_S = 60.0  # generous: two shared cores, another job beside the tests


@dataclass
class Stack(PoolStack):
    broker: LocalRedis | None = None


@pytest.fixture(scope="module")
def stack(postgres_url, tmp_path_factory) -> Iterator[Stack]:
    """Pools A and B (one process each, A reserving 3 tasks ahead), supervised, on a Redis of
    their own (the tests restart it)."""
    settings = dict(database_url=postgres_url, llm_api="completions", llm_max_retries=0, task_max_retries=1,
                    task_retry_backoff_s=0.2, concurrency={"A": 1, "B": 1}, prefetch={"A": 3, "B": 1})
    with lab_stack(tmp_path_factory.mktemp("broker-restart"), POOL_PARTS, pools=("A", "B"), settings=settings,
                   llm_latency_ms=LLM_LATENCY_MS, frontdoor=False, tenants=(), dotenv=False,
                   supervise=RestartPolicy(first_backoff_s=0.5), supervise_poll_s=0.2) as lab:
        yield Stack(**vars(PoolStack.of(lab)), broker=lab.redis)


def pool_log(stack: Stack, name: str) -> str:
    return stack.pools.pools[name].log_path.read_text(errors="replace")


# --- the transport, on its own -------------------------------------------------------------------

def test_a_channel_of_a_closed_connection_fails_with_a_connection_error(redis_url):
    """The race behind "Unrecoverable error: AttributeError ... 'hostname'": a channel asked to
    ack or restore after its connection was collected. kombu's transport raises AttributeError
    (fatal to the worker); ours raises a connection error (the consumer reconnects)."""
    for transport, expected in ((None, AttributeError),
                                ("workers.redis_broker:Transport", redis.ConnectionError)):
        connection = kombu.Connection(redis_url, transport=transport)
        channel = connection.channel()
        channel._disconnect_pools()  # what closing the channel does
        connection._do_close_transport()  # what collecting the connection does
        with pytest.raises(expected) as info:
            channel.qos.restore_by_tag("a-delivery-tag")
        if transport is not None:
            assert isinstance(info.value, channel.connection_errors)
            assert "closed" in str(info.value)


def test_messages_reserved_when_the_broker_went_away_come_back_when_it_returns(tmp_path):
    """Not after the visibility timeout (15 minutes by default): at the next connection."""
    server = LocalRedis(tmp_path)
    server.start()
    try:
        options = {"visibility_timeout": 3600}
        producer = kombu.Connection(server.url, transport="workers.redis_broker:Transport",
                                    transport_options=options)
        queue = kombu.Queue("restart-test", routing_key="restart-test")
        producer.Producer().publish({"n": 1}, routing_key="restart-test", declare=[queue])
        consumer = kombu.Connection(server.url, transport="workers.redis_broker:Transport",
                                    transport_options=options)
        channel = consumer.channel()
        message = queue(channel).get(no_ack=False)  # reserved, never acked
        assert message is not None and message.payload == {"n": 1}
        server.stop()
        with pytest.raises(redis.ConnectionError):
            channel.close()  # the restore at close fails: the broker is away
        server.start()  # the append-only file kept the unacked hash
        client = redis.Redis.from_url(server.url)
        assert client.llen("restart-test") == 0
        kombu.Connection(server.url, transport="workers.redis_broker:Transport",
                         transport_options=options).channel()  # the next connection
        assert client.llen("restart-test") == 1
    finally:
        server.stop()


def test_a_channel_reuses_one_client_until_its_pool_is_replaced(redis_url):
    connection = kombu.Connection(redis_url, transport="workers.redis_broker:Transport")
    try:
        channel = connection.channel()
        first = channel._create_client()
        assert channel._create_client() is first and first.connection_pool is channel.pool
        queue = kombu.Queue("reuse-test", routing_key="reuse-test")
        producer = kombu.Producer(channel)
        for n in range(3):  # publishes and acks go through the one client
            producer.publish({"n": n}, routing_key="reuse-test", declare=[queue])
        received = [queue(channel).get(no_ack=False) for _ in range(3)]
        for message in received:
            message.ack()
        assert [m.payload["n"] for m in received] == [0, 1, 2]
        assert channel._create_client() is first
        channel._disconnect_pools()  # what a fork or a lost connection does
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool
        assert second.ping()
    finally:
        connection.release()


# --- worker pools ----------------------------------------------------------------------------------

def test_pools_survive_a_broker_restart_and_answer_what_was_in_flight_and_what_comes_after(stack):
    before = [submit(stack) for _ in range(4)]  # one running, three reserved by pool A
    time.sleep(0.8)
    pids = {name: pool.pid for name, pool in stack.pools.pools.items()}
    stack.broker.restart(down_s=DOWN_S)
    after = submit(stack)
    results = answered(stack.store, [t.request_id for t in (*before, after)], ANSWER_S)
    assert all(r.ok and r.answer == LLM_ANSWER.rstrip(".") for r in results), results
    assert {name: pool.pid for name, pool in stack.pools.pools.items()} == pids  # nobody crashed
    assert stack.pools.restarts == {"A": 0, "B": 0}
    log = pool_log(stack, "A")
    assert "Unrecoverable error" not in log
    assert "put back on their queues" in log  # the reserved ones, at once after the reconnect

    async def wait_via_redis() -> AnswerResult:  # and the result reached Redis too
        waiter = open_result_waiter(stack.app())
        await waiter.start()
        try:
            return await waiter.wait(after.task_id, 10.0)
        finally:
            await waiter.close()

    assert asyncio.run(wait_via_redis()).answer == results[-1].answer


def test_a_killed_pool_is_restarted_while_the_others_keep_running(stack):
    a, b = stack.pools.pools["A"], stack.pools.pools["B"]
    os.kill(a.pid, signal.SIGKILL)  # the pool's main process, as the kernel's OOM killer would
    deadline = time.monotonic() + 30
    while stack.pools.restarts["A"] < 1:
        assert time.monotonic() < deadline, "pool A was not restarted"
        time.sleep(0.1)
    stack.pools.wait_ready("A")
    assert stack.pools.pools["A"].pid != a.pid and stack.pools.pools["A"].alive()
    assert stack.pools.pools["B"] is b and b.alive() and stack.pools.restarts["B"] == 0
    assert stack.pools.health["A"].exit_codes[-1] == -signal.SIGKILL
    result, = answered(stack.store, [submit(stack).request_id], ANSWER_S)
    assert result.ok


# --- the result wait -------------------------------------------------------------------------------

def backend_of(url: str):
    from celery import Celery

    return Celery("restart-results", broker=url, backend=url).backend


def finished(task_id: str, answer: str) -> dict:
    return AnswerResult(request_id=task_id, tier="A", strategy="no_retrieval",
                        answer=answer).model_dump(mode="json")


def test_a_result_wait_survives_a_redis_restart(tmp_path):
    server = LocalRedis(tmp_path)
    server.start()
    backend = backend_of(server.url)
    stored: dict[str, AnswerResult] = {}

    async def scenario() -> None:
        waiter = RedisResultWaiter(server.url, backend.get_key_for_task, backend.decode_result,
                                   recheck_s=0.3, stored=stored.get)
        await waiter.start()
        try:
            # 0. Celery recorded a failure in Redis (its own result write failed mid-restart) for
            # work the records hold as done: the records decide
            done = uuid.uuid4().hex
            stored[done] = AnswerResult(request_id=done, tier="A", strategy="no_retrieval", answer="done")
            await asyncio.to_thread(backend.store_result, done,
                                    redis.ConnectionError("Connection closed by server."), "FAILURE")
            assert (await waiter.wait(done, 5.0)).answer == "done"
            # 1. a wait in progress while Redis restarts; the result is written after it is back
            across = uuid.uuid4().hex
            waiting = asyncio.create_task(waiter.wait(across, 20.0))
            await asyncio.sleep(0.3)
            await asyncio.to_thread(server.restart, 1.0)
            await asyncio.to_thread(backend.store_result, across, finished(across, "across"), "SUCCESS")
            assert (await waiting).answer == "across"
            # 2. connections left from before the restart are not a failure afterwards
            for _ in range(3):
                again = uuid.uuid4().hex
                await asyncio.to_thread(backend.store_result, again, finished(again, "after"), "SUCCESS")
                assert (await waiter.wait(again, 5.0)).answer == "after"
            # 3. while Redis is away, a result the records hold is returned from there
            await asyncio.to_thread(server.stop)
            recorded = uuid.uuid4().hex
            stored[recorded] = AnswerResult(request_id=recorded, tier="A", strategy="no_retrieval",
                                            answer="from the records")
            assert (await waiter.wait(recorded, 5.0)).answer == "from the records"
            # 4. away for the whole wait, nothing recorded: unavailable (never a bare error)
            started = time.monotonic()
            with pytest.raises(DependencyUnavailableError, match="result backend is unreachable"):
                await waiter.wait(uuid.uuid4().hex, 1.5)
            assert time.monotonic() - started < 4.0  # bounded by the wait, not by reconnects
            await asyncio.to_thread(server.start)
            back = uuid.uuid4().hex
            await asyncio.to_thread(backend.store_result, back, finished(back, "back"), "SUCCESS")
            assert (await waiter.wait(back, 10.0)).answer == "back"
        finally:
            await waiter.close()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


# --- the front door ----------------------------------------------------------------------------

@pytest.fixture
def front_door(stack):
    app = stack.app()
    queue = CeleryTaskQueue(app)
    with in_process_front_door(stack.store, stack.library, queue, app, health_watch_s=0.5,
                               worker_probe=functools.partial(queue.workers_alive, 0.5)) as client:
        yield client.channel, client.auth


def test_the_front_door_answers_across_a_redis_restart_and_never_says_internal(stack, front_door):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from services.frontdoor.stubs import pb2, pb2_grpc

    channel, auth = front_door
    stub = pb2_grpc.AdaptiveRagStub(channel)
    health = health_pb2_grpc.HealthStub(channel)

    def ask(timeout: float = ANSWER_S) -> pb2.AnswerReply:
        return stub.Answer(pb2.AnswerRequest(query_text="What is 2+2?"), metadata=auth, timeout=timeout)

    def health_is(status: int, within: float = 15.0) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if health.Check(health_pb2.HealthCheckRequest()).status == status:
                return True
            time.sleep(0.2)
        return False

    assert health_is(health_pb2.HealthCheckResponse.SERVING)
    assert ask().answer == LLM_ANSWER.rstrip(".")
    # An Answer waiting while Redis restarts gets its answer.
    replies: list = []
    waiting = threading.Thread(target=lambda: replies.append(ask()))
    waiting.start()
    time.sleep(0.8)  # enqueued and running
    stack.broker.stop()
    assert health_is(health_pb2.HealthCheckResponse.NOT_SERVING)
    with pytest.raises(grpc.RpcError) as info:  # asked meanwhile: unavailable, with a hint
        ask(timeout=15.0)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE, info.value.details()
    assert "retry-after" in dict(info.value.trailing_metadata())
    stack.broker.start()
    waiting.join(ANSWER_S)
    assert replies and replies[0].answer == LLM_ANSWER.rstrip(".")
    # Connections left dead by the restart cost no call afterwards.
    for _ in range(3):
        assert ask().answer == LLM_ANSWER.rstrip(".")
    assert health_is(health_pb2.HealthCheckResponse.SERVING)


def test_health_is_not_serving_while_no_worker_runs(stack, front_door):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel, _ = front_door
    health = health_pb2_grpc.HealthStub(channel)

    def status() -> int:
        return health.Check(health_pb2.HealthCheckRequest()).status

    deadline = time.monotonic() + 15
    while status() != health_pb2.HealthCheckResponse.SERVING:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    stack.pools.stop()  # every pool (the supervisor stops with them)
    deadline = time.monotonic() + 15
    while status() != health_pb2.HealthCheckResponse.NOT_SERVING:
        assert time.monotonic() < deadline, "health stayed SERVING with no worker"
        time.sleep(0.2)
