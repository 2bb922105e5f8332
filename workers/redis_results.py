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
+redis://...`, Celery's `<backend>+<url>` form; `WriteOnceSentinelBackend+sentinel://...` with
Sentinel) whenever the broker is Redis.
"""

from __future__ import annotations

from typing import Any

from celery import states
from celery.backends.redis import RedisBackend, SentinelBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str

from workers.redis_connections import RedisAddress, parse

BACKEND = "workers.redis_results:WriteOnceRedisBackend"
SENTINEL_BACKEND = "workers.redis_results:WriteOnceSentinelBackend"


def backend_url(address: RedisAddress | str) -> str:
    """The `result_backend` setting that selects this backend on `address` (a `REDIS_URL` or
    its parsed form; with Sentinel the group's name goes in `result_backend_transport_options`)."""
    if isinstance(address, str):
        address = parse(address)
    return f"{SENTINEL_BACKEND if address.is_sentinel else BACKEND}+{address.celery_url()}"


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


class WriteOnceSentinelBackend(WriteOnceRedisBackend, SentinelBackend):
    """The same on Celery's `SentinelBackend`: the primary found through Sentinel."""
