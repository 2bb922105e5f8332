"""Enqueue a request on its tier's queue, look at queue depth, wait for a result.

Light on purpose (the front door imports it): only the Celery app, never the task module, the
LLM or the retriever. Tasks are sent by name.

The Celery task id of a primary run is the request id itself, so anyone holding a request id can
wait for its result again (`result_for`), e.g. `GetResult` after a client's deadline passed.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult

from workers import celery_app as _celery

TASK_NAME = "adaptive_rag.answer"
QUEUE_FOR_TIER = {"A": "tier-a", "B": "tier-b", "C": "tier-c"}
SHADOW_QUEUE = "shadow"


def _app(app: Celery | None) -> Celery:
    return app or _celery.app


def task_id_for(request_id: str, kind: str = "primary", tier: str | None = None) -> str:
    """The primary run's task id is the request id; a shadow run adds its tier."""
    return request_id if kind == "primary" else f"{request_id}.{kind}.{tier}"


def enqueue(
    request_id: str, query: str, tier: str, strategy: str, kind: str = "primary",
    *, app: Celery | None = None,
) -> AsyncResult:
    """Send `adaptive_rag.answer` to the tier's queue (`shadow` runs go to the shadow queue)
    with that tier's soft/hard time limits; returns the handle to wait on."""
    if tier not in QUEUE_FOR_TIER:
        raise ValueError(f"unknown tier {tier!r}; one of A, B, C")
    app = _app(app)
    soft, hard = _celery.app_settings(app).time_limits(tier)
    queue = QUEUE_FOR_TIER[tier] if kind == "primary" else SHADOW_QUEUE
    if kind == "primary" and _celery.app_settings(app).shared_queue:
        queue = _celery.SHARED_QUEUE  # comparison setup: all tiers on one queue
    return app.send_task(
        TASK_NAME,
        kwargs={"request_id": request_id, "query": query, "tier": tier, "strategy": strategy,
                "kind": kind, "enqueued_at": time.time()},
        task_id=task_id_for(request_id, kind, tier), queue=queue, routing_key=queue,
        soft_time_limit=soft, time_limit=hard,
    )


def result_for(request_id: str, *, app: Celery | None = None) -> AsyncResult:
    """The handle of a primary run enqueued earlier (by this or another front-door replica)."""
    return _app(app).AsyncResult(task_id_for(request_id))


def queue_depth(queue: str, *, app: Celery | None = None) -> int:
    """Messages waiting in `queue` (not the ones workers already reserved).

    kombu's passive declare counts them per transport: LLEN over the queue's Redis lists
    (one per priority), or the message files of the queue in the filesystem broker.
    """
    if queue not in (*_celery.QUEUES, _celery.SHARED_QUEUE):
        raise ValueError(f"unknown queue {queue!r}; one of {', '.join(_celery.QUEUES)}")
    with _app(app).pool.acquire(block=True) as connection:
        channel = connection.default_channel
        try:
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
        except connection.channel_errors:  # Redis: an empty queue has no key at all
            return 0


def wait_result(async_result: AsyncResult, timeout: float) -> dict[str, Any]:
    """The task's result dict, waiting at most `timeout` seconds (Redis: pub/sub, no polling).

    Raises `TimeoutError` when it is not there in time (the task keeps running). A task that
    died outside its own error handling (e.g. killed at the hard time limit) comes back as an
    error result with code INTERNAL rather than an exception.
    """
    try:
        return async_result.get(timeout=timeout, propagate=True, disable_sync_subtasks=False)
    except CeleryTimeoutError as exc:
        raise TimeoutError(f"no result for task {async_result.id} within {timeout:.1f} s") from exc
    except Exception as exc:
        if async_result.state != "FAILURE":  # not the task's failure (e.g. Redis unreachable)
            raise
        return {
            "request_id": async_result.id.split(".", 1)[0], "kind": None, "tier": None,
            "strategy": None, "answer": None, "steps": 0, "sources": [], "timings": {},
            "error": f"{type(exc).__name__}: {exc}", "error_code": "INTERNAL",
        }
