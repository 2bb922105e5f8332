"""The front door's queue side on Celery: `workers.dispatch` behind the `Dispatcher` protocol.

Celery's Redis result backend is not thread-safe (one pub/sub connection per backend; Celery keeps
one backend per thread, celery/celery#3761, #6335), and an `AsyncResult` keeps the backend of the
thread that made it. The front door enqueues and waits on a thread pool, so `wait_result` makes a
fresh handle for the task id in the waiting thread: each thread only ever touches its own backend.
"""

from __future__ import annotations

from typing import Any

from workers import dispatch


class CeleryDispatcher:
    """Enqueue on the tier queues, read their depth, wait for results (Redis pub/sub)."""

    queue_for_tier = dispatch.QUEUE_FOR_TIER

    def enqueue(self, request_id: str, query: str, tier: str, strategy: str, kind: str = "primary") -> str:
        """Send the task; returns its task id (the handle the waiting thread turns into a result)."""
        return dispatch.enqueue(request_id, query, tier, strategy, kind).id

    def queue_depth(self, queue: str) -> int:
        return dispatch.queue_depth(queue)

    def wait_result(self, handle: str, timeout: float) -> dict[str, Any]:
        from workers.celery_app import app

        return dispatch.wait_result(app.AsyncResult(handle), timeout)

    def handle_for(self, request_id: str, kind: str = "primary") -> str | None:
        """A primary run's task id is its request id, so any replica can wait for it."""
        return dispatch.task_id_for(request_id) if kind == "primary" else None
