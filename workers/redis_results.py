"""The Redis result backend: Celery's, without its read before each success.

Celery's key-value backends read a task's stored meta before writing a new one, and skip the
write when a SUCCESS is already there: a task delivered twice (a lost worker, a network split)
must not overwrite the first run's result with a different one. Here every success stored is the
result the records database holds: `answer_task` writes a result once and returns the stored one
to every later delivery. A second SUCCESS for a task therefore carries the same result, and the
read guards nothing. Skipping it saves one Redis round trip per answer, between the worker's
result write and the waiting front door's wake-up, where it counts in every answer's latency.

Other states (RETRY, FAILURE) keep Celery's guard: a failing redelivery must not replace a stored
success.

Selected by `result_backend` in `workers.celery_app` (`workers.redis_results:WriteOnceRedisBackend
+redis://...`, Celery's `<backend>+<url>` form) whenever the broker is Redis.
"""

from __future__ import annotations

from typing import Any

from celery import states
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str

BACKEND = "workers.redis_results:WriteOnceRedisBackend"


def backend_url(redis_url: str) -> str:
    """The `result_backend` setting that selects this backend on `redis_url`."""
    return f"{BACKEND}+{redis_url}"


class WriteOnceRedisBackend(RedisBackend):
    """Celery's `RedisBackend`; a SUCCESS is written without reading the key first (see the
    module)."""

    def _store_result(self, task_id: Any, result: Any, state: str, traceback: Any = None,
                      request: Any = None, **kwargs: Any) -> Any:
        if state != states.SUCCESS:
            return super()._store_result(task_id, result, state, traceback=traceback,
                                         request=request, **kwargs)
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = bytes_to_str(task_id)
        try:
            self._set_with_state(self.get_key_for_task(task_id), self.encode(meta), state)
        except BackendStoreError as exc:
            raise BackendStoreError(str(exc), state=state, task_id=task_id) from exc
        return result
