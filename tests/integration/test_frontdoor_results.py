"""The asyncio result waiter the front door uses (`workers.client.RedisResultWaiter`) against real
Redis, with results written by the workers' result backend (`workers.redis_results`, Celery's
Redis backend: `store_result` is SET + PUBLISH, exactly what a worker does)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
import redis
from celery import Celery

from adaptive_rag.contracts import AnswerResult, ErrorCode
from workers.client import RedisResultWaiter
from workers.redis_results import backend_url

pytestmark = pytest.mark.integration


@pytest.fixture
def backend(redis_url):
    app = Celery("results-test", broker=redis_url, backend=backend_url(redis_url))
    # 200 writer threads at once: above redis-py's default pool limit of 100 connections
    app.conf.redis_max_connections = 256
    return app.backend


def redis_calls(redis_url: str, command: str) -> int:
    return redis.Redis.from_url(redis_url).info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_a_success_is_stored_without_reading_the_key_first(backend, redis_url):
    task_id = uuid.uuid4().hex
    assert type(backend).__name__ == "WriteOnceRedisBackend"
    gets = redis_calls(redis_url, "get")
    backend.store_result(task_id, result(task_id, "first"), "SUCCESS")
    assert redis_calls(redis_url, "get") == gets  # Celery's own backend reads the key first
    assert backend.get_task_meta(task_id)["result"]["answer"] == "first"


def test_a_retry_or_failure_never_replaces_a_stored_success(backend, redis_url):
    task_id = uuid.uuid4().hex
    backend.store_result(task_id, result(task_id, "stored"), "SUCCESS")
    backend.store_result(task_id, None, "RETRY")
    backend.store_result(task_id, KeyError("late failure"), "FAILURE")
    meta = Celery("results-reader", backend=backend_url(redis_url)).backend.get_task_meta(task_id)
    assert (meta["status"], meta["result"]["answer"]) == ("SUCCESS", "stored")


def waiter_for(backend, redis_url, recheck_s: float = 2.0) -> RedisResultWaiter:
    return RedisResultWaiter(redis_url, backend.get_key_for_task, backend.decode_result, recheck_s)


def result(task_id: str, answer: str = "") -> dict:
    """What the answer task returns for `task_id` (its JSON dump)."""
    return AnswerResult(request_id=task_id, tier="B", strategy="single_step",
                        answer=answer).model_dump(mode="json")


def finish_later(backend, task_id: str, delay_s: float, value: dict | None = None, state: str = "SUCCESS"):
    def run() -> None:
        time.sleep(delay_s)
        result = value if state == "SUCCESS" else KeyError("no such passage")
        backend.store_result(task_id, result, state)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_results_published_before_or_after_the_wait_begins(backend, redis_url):
    async def scenario():
        waiter = waiter_for(backend, redis_url)
        await waiter.start()
        try:
            early = uuid.uuid4().hex
            backend.store_result(early, result(early, "early"), "SUCCESS")
            assert (await waiter.wait(early, 2.0)).answer == "early"
            late = uuid.uuid4().hex
            finish_later(backend, late, 0.3, result(late, "late"))
            started = time.monotonic()
            assert (await waiter.wait(late, 5.0)).answer == "late"
            assert time.monotonic() - started < 1.5  # pub/sub, not the 2 s recheck
            failed = uuid.uuid4().hex
            finish_later(backend, failed, 0.1, state="FAILURE")
            error = await waiter.wait(failed, 5.0)
            assert error.error_code is ErrorCode.INTERNAL and "KeyError" in error.error
            assert error.request_id == failed
            with pytest.raises(TimeoutError):
                await waiter.wait(uuid.uuid4().hex, 0.3)
            assert waiter._waiters == {}  # every subscription released
        finally:
            await waiter.close()

    asyncio.run(scenario())


def test_many_concurrent_waits_share_one_connection(backend, redis_url):
    async def scenario():
        waiter = waiter_for(backend, redis_url)
        await waiter.start()
        try:
            ids = [uuid.uuid4().hex for _ in range(200)]
            waits = [asyncio.create_task(waiter.wait(task_id, 10.0)) for task_id in ids]
            await asyncio.sleep(0.2)
            threads = [finish_later(backend, task_id, 0.0, result(task_id)) for task_id in ids]
            results = await asyncio.gather(*waits)
            for thread in threads:
                thread.join()
            assert [r.request_id for r in results] == ids
        finally:
            await waiter.close()

    asyncio.run(scenario())


def test_a_dropped_pubsub_connection_costs_no_result(backend, redis_url):
    import redis

    async def scenario():
        waiter = waiter_for(backend, redis_url, recheck_s=0.5)
        await waiter.start()
        try:
            killed = redis.Redis.from_url(redis_url).client_kill_filter(_type="pubsub")
            assert killed >= 1
            task_id = uuid.uuid4().hex
            finish_later(backend, task_id, 0.2, result(task_id, "still here"))
            assert (await waiter.wait(task_id, 5.0)).answer == "still here"
            later = uuid.uuid4().hex  # and the reader is subscribed again afterwards
            finish_later(backend, later, 1.0, result(later))
            assert (await waiter.wait(later, 5.0)).request_id == later
        finally:
            await waiter.close()

    asyncio.run(scenario())
