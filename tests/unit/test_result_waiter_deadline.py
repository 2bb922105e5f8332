"""The Redis result waiter at its deadline (fake Redis connection): a healthy Redis and no result
yet is a timeout (the client gets DEADLINE_EXCEEDED and reads the answer later), never "the result
backend is unreachable" (UNAVAILABLE); a read that hangs while time is left still is."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from adaptive_rag.contracts import AnswerTask, Tier
from adaptive_rag.errors import DependencyUnavailableError
from adaptive_rag.serving.answering import RecordsUnavailable
from workers.client import RedisResultWaiter


class SlowRedis:
    """GET answers None (no result yet) after `delay_s`."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.gets = 0

    async def get(self, key: str) -> bytes | None:
        self.gets += 1
        await asyncio.sleep(self.delay_s)
        return None


def waiter(redis: SlowRedis) -> RedisResultWaiter:
    w = RedisResultWaiter("redis://unused", key_for=lambda task_id: f"meta-{task_id}", decode=json.loads,
                          recheck_s=0.05)
    w._redis = redis  # type: ignore[assignment]  # no pub/sub: the rechecks read the key
    return w


def test_no_result_by_the_deadline_from_a_healthy_redis_is_a_timeout() -> None:
    redis = SlowRedis(delay_s=0.003)  # every read takes a few ms, as over a network

    async def go() -> None:
        await waiter(redis).wait("r1", timeout=0.3)

    with pytest.raises(TimeoutError):
        asyncio.run(go())
    assert redis.gets >= 2


def test_a_read_that_hangs_while_time_is_left_is_an_unreachable_backend() -> None:
    redis = SlowRedis(delay_s=10.0)

    async def go() -> None:
        await waiter(redis).wait("r1", timeout=0.8)

    with pytest.raises(DependencyUnavailableError, match="unreachable"):
        asyncio.run(go())


@pytest.mark.parametrize(("exc_type", "code"), [
    ("TimeLimitExceeded", "time_limit"), ("SoftTimeLimitExceeded", "time_limit"),
    ("RecordsUnavailable", "dependency_unavailable"), ("KeyError", "internal"),
])
def test_a_failure_celery_recorded_keeps_its_meaning_and_names_no_class_it_knows(exc_type: str, code: str) -> None:
    from celery import states

    from workers.client import result_from_meta

    result = result_from_meta("r1", {"status": states.FAILURE,
                                     "result": {"exc_type": exc_type, "exc_message": "(315.0,)"}})
    assert result.error_code.value == code and result.request_id == "r1"
    assert (exc_type in result.error) == (code == "internal")


@pytest.mark.parametrize("failure", [TimeLimitExceeded(315.0), SoftTimeLimitExceeded(),
                                     RecordsUnavailable("the records stayed away"), KeyError("oops")])
def test_the_worker_records_a_dead_task_with_the_code_its_client_reads(failure, monkeypatch) -> None:
    """`workers.tasks` (the exception itself) and `workers.client` (its class name in the result
    backend) decide the code of a task that died alike."""
    from celery import states

    tasks = pytest.importorskip("workers.tasks")
    from workers.client import result_from_meta

    written = []
    monkeypatch.setattr(tasks, "write_once", lambda store, result, delivery: written.append(result))
    monkeypatch.setattr(tasks, "resources", lambda: SimpleNamespace(store=None))
    task = AnswerTask(request_id="r1", tenant="acme", query="q", tier=Tier.B, strategy="single_step",
                      enqueued_at=0.0)
    tasks._record_failure(task_id="r1", exception=failure, kwargs={"task": task.model_dump(mode="json")})
    read = result_from_meta("r1", {"status": states.FAILURE,
                                   "result": {"exc_type": type(failure).__name__, "exc_message": str(failure)}})
    assert [r.error_code for r in written] == [read.error_code]
