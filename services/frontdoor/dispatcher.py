"""The front door's queue side on Celery: `workers.dispatch` behind the `Dispatcher` protocol.

Waiting for a result:
- Redis result backend (`REDIS_URL`): `await_result` on the event loop through one shared pub/sub
  connection (`results.RedisResultWaiter`), no thread per waiting Answer.
- Any other backend (the server-less file backend of the embedded demo): `wait_result`, Celery's
  blocking `AsyncResult.get`, which the front door runs on its wait thread pool. Celery keeps one
  backend per thread and an `AsyncResult` holds the backend of the thread that made it, so the
  handle is the task id and the waiting thread makes its own `AsyncResult` from it.
"""

from __future__ import annotations

from typing import Any

from workers import dispatch
from workers.celery_app import app

from services.frontdoor.logs import get_logger
from services.frontdoor.results import RedisResultWaiter

LOG = get_logger("frontdoor.dispatch")


class CeleryDispatcher:
    """Enqueue on the tier queues, read their depth, wait for results."""

    queue_for_tier = dispatch.QUEUE_FOR_TIER

    def __init__(self) -> None:
        self._waiter: RedisResultWaiter | None = None

    async def start(self) -> None:
        """Open the pub/sub result waiter when results live in Redis (call on the server's loop)."""
        backend_url = str(app.conf.result_backend or "")
        if backend_url.startswith(("redis://", "rediss://", "unix://")):
            backend = app.backend
            self._waiter = RedisResultWaiter(backend_url, backend.get_key_for_task, backend.decode_result)
            await self._waiter.start()
        LOG.info("result_waits", mode="redis-pubsub" if self._waiter else "threads",
                 backend=backend_url.split("://", 1)[0])

    async def stop(self) -> None:
        if self._waiter is not None:
            await self._waiter.close()
            self._waiter = None

    @property
    def awaits_results(self) -> bool:
        """True when `await_result` is available (Redis); else use the blocking `wait_result`."""
        return self._waiter is not None

    async def await_result(self, handle: str, timeout: float) -> dict[str, Any]:
        assert self._waiter is not None
        return await self._waiter.wait(handle, timeout)

    def enqueue(self, request_id: str, query: str, tier: str, strategy: str, kind: str = "primary") -> str:
        """Send the task; returns its task id (dropping the AsyncResult unsubscribes this thread)."""
        return dispatch.enqueue(request_id, query, tier, strategy, kind).id

    def queue_depth(self, queue: str) -> int:
        return dispatch.queue_depth(queue)

    def wait_result(self, handle: str, timeout: float) -> dict[str, Any]:
        return dispatch.wait_result(app.AsyncResult(handle), timeout)

    def handle_for(self, request_id: str, kind: str = "primary") -> str | None:
        """A primary run's task id is its request id, so any replica can wait for it."""
        return dispatch.task_id_for(request_id) if kind == "primary" else None
