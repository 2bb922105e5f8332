"""How producers (the front door, benchmarks, tests) talk to the workers: enqueue an `AnswerTask`
on its tier's queue, read a queue's depth, wait for an `AnswerResult`.

Light on purpose: only the Celery app, never the task module, the LLM or the retriever; the task
is sent by name. The primary run's task id is the request id (`AnswerTask.task_id`), so anyone
holding a request id can wait for its result again, e.g. a `GetResult` on another replica.

Waiting for results:
- Redis result backend (`REDIS_URL`): `RedisResultWaiter`, one pub/sub connection on the event
  loop for every waiting Answer, no thread per wait. Celery's Redis backend writes a finished
  task's meta to `celery-task-meta-<id>` and publishes it on a channel of that name in one
  transaction. The connection holds one pattern subscription to every such channel, made once:
  a wait reads the key (the task may have finished before it began waiting), then sleeps on a
  future that the reader task resolves, with no subscribe and unsubscribe of its own (two
  messages per Answer fewer on the event loop; every replica sees every result's message and
  drops the ones nobody waits for, by channel name). A pub/sub connection can drop, so the key is
  read again every `recheck_s`: a lost message costs at most that long, never the answer.
- Any other backend (the server-less file backend of the embedded demo): `ThreadedResultWaiter`,
  Celery's blocking `AsyncResult.get` on a thread pool (Celery keeps one backend per thread, so
  each wait makes its own `AsyncResult` from the task id).
Encoding, key names and states are Celery's own, so nothing here parses Celery's format by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
import redis.asyncio
import structlog
from celery import Celery, states
from celery.backends.redis import SentinelBackend
from celery.exceptions import TimeoutError as CeleryTimeoutError
from kombu.exceptions import KombuError
from opentelemetry.trace import SpanKind

from adaptive_rag.contracts import (
    ANSWER_TASK, QUEUE_FOR_TIER, SHADOW_QUEUE, SHARED_QUEUE, AnswerResult, AnswerTask, CallError, ErrorCode,
    ResultKind, Tier, parse_task_id,
)
from adaptive_rag.errors import ConfigurationError, DependencyUnavailableError
from adaptive_rag.serving.ports import Records
from adaptive_rag.tracing import inject_context, span
from workers import celery_app as _celery
from workers import redis_broker, redis_connections
from workers.celery_app import QUEUES
from workers.failures import dead_task_error

LOG = structlog.get_logger("workers.client")
# A stored-result lookup that answers without Redis (the records database), used while Redis fails.
StoredResult = Callable[[str], "AnswerResult | None"]


@contextlib.contextmanager
def _broker_errors(what: str):
    """The broker's own exceptions (kombu, redis, sockets) as the library's precise error."""
    try:
        yield
    except (KombuError, redis.RedisError, OSError) as exc:
        raise DependencyUnavailableError(f"the task queue is unreachable ({what}: {type(exc).__name__}: {exc})") from exc


class CeleryTaskQueue:
    """The tier queues on Celery (`adaptive_rag.serving.ports.TaskQueue`)."""

    def __init__(self, app: Celery | None = None) -> None:
        self.app = app or _celery.app
        self.settings = _celery.app_settings(self.app)
        # Sends through an app without a result backend (no per-task result subscription);
        # the workers, configured with one, still store every result.
        self._sender = _celery.create_app(self.settings, results=False)

    def queue_name(self, tier: Tier) -> str:
        return SHARED_QUEUE if self.settings.shared_queue else QUEUE_FOR_TIER[Tier(tier)]

    def enqueue(self, task: AnswerTask) -> None:
        """Send the task to its tier's queue (shadow runs: the shadow queue) with that tier's
        soft/hard time limits; `DependencyUnavailableError` when the broker cannot take it."""
        soft, hard = self.settings.time_limits(task.tier)
        queue = self.queue_name(task.tier) if task.kind is ResultKind.PRIMARY else SHADOW_QUEUE
        # The trace goes along in the message headers (`traceparent`); the worker's Celery
        # instrumentation continues it. Done here: the sending app never knows the task itself.
        with span(f"send {ANSWER_TASK}", kind=SpanKind.PRODUCER, **{
            "messaging.system": "celery", "messaging.destination.name": queue,
            "messaging.message.id": task.task_id,
        }), _broker_errors(f"enqueue on '{queue}'"):
            self._sender.send_task(
                ANSWER_TASK, kwargs={"task": task.model_dump(mode="json")}, task_id=task.task_id,
                queue=queue, routing_key=queue, soft_time_limit=soft, time_limit=hard,
                headers=inject_context({}),
                # What monitors (Flower, events) show of the arguments: the ids, not the user's
                # query; and Celery skips formatting the arguments (60 us per enqueue).
                argsrepr="()", kwargsrepr=_arguments_shown(task),
            )

    def forget(self, task_id: str) -> None:
        """Delete the task's stored result (`celery-task-meta-<id>`, or its file): a request
        admitted again runs under the same task id, and its waiters must get the new run's
        result, not the one an earlier run left; `DependencyUnavailableError` when the result
        backend cannot be reached."""
        backend = self.app.backend
        with _broker_errors(f"forget the result of {task_id}"):
            try:
                backend.delete(backend.get_key_for_task(task_id))
            except FileNotFoundError:  # the file backend: nothing stored
                pass

    def held(self, task_ids: Collection[str]) -> set[str] | None:
        """Which of `task_ids` the broker holds, waiting on a tier queue or reserved by a worker
        (one Redis transaction over the queues' lists and the unacked hash); None for a broker
        that cannot tell (the embedded file broker: one machine, nothing in transit)."""
        with _broker_errors("look for tasks in the queues"), self.app.pool.acquire(block=True) as connection:
            channel = connection.default_channel
            if not isinstance(channel, redis_broker.Channel):
                return None
            return redis_broker.held_task_ids(channel, (*QUEUES, SHARED_QUEUE), task_ids)

    def workers_alive(self, timeout: float = 1.0) -> list[str]:
        """Names of the workers that answer a ping within `timeout` s (`tier-a@host`, ...); a
        worker's main process answers even while all its pool processes are busy."""
        with _broker_errors("ping the workers"):
            replies = self.app.control.ping(timeout=timeout)
        return sorted(name for reply in replies or () for name in reply)

    def depth(self, queue: str) -> int:
        """Messages waiting in `queue` (not the ones workers already reserved).

        kombu's virtual-transport size hook (`Channel._size`, what a passive declare reports as
        `message_count`): on Redis one pipelined LLEN over the queue's lists (one per priority),
        one round trip; the passive declare checks existence first (another round trip), and a
        missing list is an empty queue anyway. The filesystem broker counts its message files.
        """
        if queue not in (*QUEUES, SHARED_QUEUE):
            raise ValueError(f"unknown queue {queue!r}; one of {', '.join(QUEUES)}")
        with _broker_errors(f"depth of '{queue}'"), self.app.pool.acquire(block=True) as connection:
            return int(connection.default_channel._size(queue))


def _arguments_shown(task: AnswerTask) -> str:
    return (f"{{'request_id': {task.request_id!r}, 'tenant': {task.tenant!r}, "
            f"'tier': {task.tier.value!r}, 'kind': {task.kind.value!r}}}")


def result_from_meta(task_id: str, meta: dict[str, Any]) -> AnswerResult:
    """The task's result; a task that died outside its own error handling (it never returned a
    result) becomes an error result with the code `dead_task_error` gives it."""
    if meta.get("status") == states.SUCCESS and isinstance(meta.get("result"), dict):
        return AnswerResult.model_validate(meta["result"])
    failure = meta.get("result")
    if isinstance(failure, dict):
        code, detail = dead_task_error(str(failure.get("exc_type", "")))
        detail = detail or f"{failure.get('exc_type', 'Error')}: {failure.get('exc_message', '')}"
    else:
        code, detail = ErrorCode.INTERNAL, f"task ended {meta.get('status')}: {failure!r}"
    run = parse_task_id(task_id)
    return AnswerResult(  # a primary task's id names no tier: B stands in
        request_id=run.request_id, kind=run.kind, tier=run.tier or Tier.B, strategy="", error=detail,
        error_code=code,
    )


def stored_results(records: Records) -> StoredResult:
    """A `stored` lookup for `RedisResultWaiter` over the records (every result is written there
    by the worker before it reaches Redis); task ids as in `result_from_meta`."""

    def lookup(task_id: str) -> AnswerResult | None:
        return records.get_result(*parse_task_id(task_id))

    return lookup


class ThreadedResultWaiter:
    """`await wait(task_id, timeout)` through Celery's blocking wait on a thread pool."""

    def __init__(self, app: Celery | None = None, threads: int = 64) -> None:
        self.app = app or _celery.app
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="result-wait")

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _blocking_wait(self, task_id: str, timeout: float) -> AnswerResult:
        handle = self.app.AsyncResult(task_id)
        try:  # propagate=False: a failed task's exception is returned, not raised
            value = handle.get(timeout=timeout, propagate=False, disable_sync_subtasks=False,
                               interval=_celery.FILESYSTEM_POLL_S)
        except CeleryTimeoutError as exc:
            raise TimeoutError(f"no result for task {task_id} within {timeout:.1f} s") from exc
        if handle.successful():
            return result_from_meta(task_id, {"status": states.SUCCESS, "result": value})
        failure = {"exc_type": type(value).__name__, "exc_message": str(value)}
        return result_from_meta(task_id, {"status": handle.state, "result": failure})

    async def wait(self, task_id: str, timeout: float) -> AnswerResult:
        loop = asyncio.get_running_loop()
        # Celery's blocking wait can overshoot its timeout (it drains its result consumer in 1 s
        # steps), so the budget is enforced here too; a late thread ends idle.
        return await asyncio.wait_for(
            loop.run_in_executor(self._pool, functools.partial(self._blocking_wait, task_id, timeout)),
            timeout,
        )


# What a Redis outage or restart raises on the waiter's connections.
REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, ConnectionError)
# A read cut short with less than this left of the wait says the deadline came, not that Redis
# hangs: a healthy GET takes about a millisecond but not nothing.
HUNG_READ_S = 0.5
class RedisResultWaiter:
    """`await wait(task_id, timeout)` -> the task's result, `TimeoutError`, or
    `DependencyUnavailableError` when Redis stayed unreachable until the timeout.

    A Redis restart costs no answer: a failed read is retried every `recheck_s` until the timeout
    (the reader subscribes again once it reconnects, and connections left dead by the restart are
    pinged and replaced before use). While Redis
    fails, `stored` (when given: the records database, where the worker writes every result
    first) is asked instead, so a result written during the outage is not waited for in vain.
    """

    def __init__(
        self, redis_url: str, key_for: Callable[[str], bytes | str],
        decode: Callable[[bytes], dict[str, Any]], recheck_s: float = 2.0, max_connections: int = 16,
        stored: StoredResult | None = None, health_check_interval_s: float = 10.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.max_connections = max_connections
        self.redis_url = redis_url
        self._key_for = key_for
        self._decode = decode
        self.recheck_s = recheck_s
        self.stored = stored
        self.health_check_interval_s = health_check_interval_s
        self.connect_timeout_s = connect_timeout_s
        self._waiters: dict[str, set[asyncio.Future]] = {}
        self._redis: redis.asyncio.Redis | None = None
        self._pubsub = None
        self._reader: asyncio.Task | None = None
        # Every result channel: the key prefix (Celery's, with any global prefix) and a wildcard.
        # (Celery names no key without a task id: the prefix is a key without its id.)
        self.pattern = _glob_escape(self._key("0")[:-1]) + "*"

    async def start(self) -> None:
        # Reads of finished keys share a few connections; a burst of waits queues for them
        # instead of failing with "Too many connections".
        # (with Sentinel: of the current primary, asked again at every new connection)
        self._redis = redis_connections.async_client(
            self.redis_url, max_connections=self.max_connections,
            health_check_interval=self.health_check_interval_s,
            socket_connect_timeout=self.connect_timeout_s, socket_keepalive=True,
        )
        try:
            await self._connect()
        except REDIS_ERRORS as exc:  # Redis away at start: the reader keeps trying
            LOG.warning("result_pubsub_lost", error=str(exc))
        self._reader = asyncio.create_task(self._read_forever(), name="result-reader")

    async def _connect(self) -> None:
        assert self._redis is not None
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.psubscribe(self.pattern)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._pubsub is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._pubsub.aclose()
        if self._redis is not None:
            await self._redis.aclose(close_connection_pool=True)

    def _key(self, task_id: str) -> str:
        key = self._key_for(task_id)
        return key.decode() if isinstance(key, bytes) else key

    async def wait(self, task_id: str, timeout: float) -> AnswerResult:
        if self._redis is None:
            raise RuntimeError("RedisResultWaiter.start() was not awaited")
        key = self._key(task_id)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        waiters = self._waiters.setdefault(key, set())
        waiters.add(future)
        deadline = loop.time() + timeout
        failure: BaseException | None = None  # the last Redis error, None once Redis answers
        try:
            while True:
                remaining = deadline - loop.time()
                try:
                    payload = await asyncio.wait_for(self._redis.get(key), max(remaining, 0.001))
                    self._offer(key, payload)
                    failure = None
                except REDIS_ERRORS as exc:
                    failure = exc
                except TimeoutError as exc:  # one call outlived the budget (a hung connection)
                    if remaining >= HUNG_READ_S:  # else only the deadline came: DEADLINE_EXCEEDED
                        failure = failure or exc
                if failure is not None and not future.done():
                    found = await self._stored_result(task_id)
                    if found is not None:
                        return found
                if future.done():
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if failure is not None:
                        raise DependencyUnavailableError(
                            f"the result backend is unreachable ({type(failure).__name__}: "
                            f"{failure}); task {task_id} keeps running, its result can be read "
                            "later by its request id", reason=CallError.RESULT_STORE_UNAVAILABLE,
                        ) from failure
                    raise TimeoutError(f"no result for task {task_id} within {timeout:.2f} s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(future), min(self.recheck_s, remaining))
                if future.done():
                    break
            meta = future.result()
            if meta.get("status") != states.SUCCESS:
                # A failure in Redis may be Celery's own (the result write failed while Redis
                # restarted) for work the records hold as done: the records decide.
                found = await self._stored_result(task_id)
                if found is not None:
                    return found
            return result_from_meta(task_id, meta)
        finally:
            waiters.discard(future)
            if not waiters and self._waiters.get(key) is waiters:
                del self._waiters[key]

    async def _stored_result(self, task_id: str) -> AnswerResult | None:
        """The result from `stored` (Redis is failing), or None (none yet, or no lookup)."""
        if self.stored is None:
            return None
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.stored, task_id)
        except Exception as exc:  # noqa: BLE001 - the records may be away too; Redis may return
            LOG.warning("stored_result_lookup_failed", task_id=task_id, error=str(exc))
            return None

    def _offer(self, key: str, payload: bytes | None) -> None:
        """Resolve the waiters of `key` when `payload` is a finished task's meta."""
        if payload is None or key not in self._waiters:
            return
        meta = self._decode(payload)
        if meta.get("status") not in states.READY_STATES:
            return
        for future in self._waiters[key]:
            if not future.done():
                future.set_result(meta)

    async def _read_forever(self) -> None:
        lost = False
        while True:
            try:
                if self._pubsub is None:
                    await self._connect()
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if lost:
                    LOG.info("result_pubsub_back")
                    lost = False
                if message and message.get("type") == "pmessage":
                    channel = message["channel"]
                    self._offer(channel.decode() if isinstance(channel, bytes) else channel,
                                message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: reconnect, rechecks cover the gap
                if not lost:
                    LOG.warning("result_pubsub_lost", error=str(exc))
                lost = True
                await asyncio.sleep(0.5)
                old, self._pubsub = self._pubsub, None
                if old is not None:
                    with contextlib.suppress(Exception):
                        await old.aclose()
                with contextlib.suppress(Exception):
                    await self._connect()


def _glob_escape(text: str) -> str:
    """`text` matched literally in a Redis glob pattern (PSUBSCRIBE)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def open_result_waiter(
    app: Celery | None = None, threads: int = 64, stored: StoredResult | None = None,
) -> RedisResultWaiter | ThreadedResultWaiter:
    """The waiter for the app's result backend (Redis: pub/sub; otherwise threads). Call
    `await waiter.start()` on the event loop that will wait, and `await waiter.close()` at the end.

    `stored(task_id)`: a blocking lookup of a finished task's result without Redis (the front
    door passes the records database), asked while Redis fails.
    """
    app = app or _celery.app
    backend = app.backend
    backend_url = str(getattr(backend, "url", None) or "")  # without a `<backend>+` prefix
    if isinstance(backend, SentinelBackend):  # the app's own REDIS_URL names the group
        backend_url = _celery.app_settings(app).redis_url or ""
        if not redis_connections.parse(backend_url).is_sentinel:
            raise ConfigurationError("a Sentinel result backend needs REDIS_URL=sentinel://...")
    if backend_url.startswith(("redis://", "rediss://", "unix://", "sentinel://")):
        return RedisResultWaiter(
            backend_url, backend.get_key_for_task, backend.decode_result, stored=stored,
            health_check_interval_s=_celery.REDIS_CONNECTION_OPTIONS["health_check_interval"],
            connect_timeout_s=_celery.REDIS_CONNECTION_OPTIONS["socket_connect_timeout"],
        )
    return ThreadedResultWaiter(app, threads)
