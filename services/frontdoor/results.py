"""Waiting for Celery results from asyncio: one Redis pub/sub connection for every waiting
Answer, no thread per wait.

Celery's Redis result backend writes a finished task's meta to `celery-task-meta-<id>` and
publishes the same payload on a channel of that name, in one transaction. A wait subscribes to
the channel, then reads the key (the task may have finished before the subscription), then
sleeps on a future that the single reader task resolves. Because the subscription and the read
travel on different connections, and a pub/sub connection can drop, the key is read again every
`recheck_s` while waiting: a lost message costs at most that long, never the answer.

Encoding, key names and states are Celery's own (`backend.get_key_for_task`,
`backend.decode_result`, `celery.states`), so nothing here parses Celery's format by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from celery import states

from services.frontdoor.logs import get_logger

LOG = get_logger("frontdoor.results")
# Subscribed from the start so the reader always has a connection to read from.
IDLE_CHANNEL = "arag-frontdoor-idle"


def result_from_meta(task_id: str, meta: dict[str, Any]) -> dict[str, Any]:
    """The task's return dict; a task that died outside its own error handling becomes an error
    result (code INTERNAL), like `workers.dispatch.wait_result`."""
    if meta.get("status") == states.SUCCESS and isinstance(meta.get("result"), dict):
        return meta["result"]
    failure = meta.get("result")
    if isinstance(failure, dict):
        detail = f"{failure.get('exc_type', 'Error')}: {failure.get('exc_message', '')}"
    else:
        detail = f"task ended {meta.get('status')}: {failure!r}"
    return {
        "request_id": task_id.split(".", 1)[0], "kind": None, "tier": None, "strategy": None,
        "answer": None, "steps": 0, "sources": [], "timings": {}, "error": detail,
        "error_code": "INTERNAL",
    }


class RedisResultWaiter:
    """`await wait(task_id, timeout)` -> the task's result dict, or `TimeoutError`."""

    def __init__(
        self, redis_url: str, key_for: Callable[[str], bytes | str],
        decode: Callable[[bytes], dict[str, Any]], recheck_s: float = 2.0, max_connections: int = 16,
    ) -> None:
        self.max_connections = max_connections
        self.redis_url = redis_url
        self._key_for = key_for
        self._decode = decode
        self.recheck_s = recheck_s
        self._waiters: dict[str, set[asyncio.Future]] = {}
        self._redis: aioredis.Redis | None = None
        self._pubsub = None
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        # Reads of finished keys share a few connections; a burst of waits queues for them
        # instead of failing with "Too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            self.redis_url, max_connections=self.max_connections, timeout=None
        )
        self._redis = aioredis.Redis(connection_pool=pool)
        await self._connect()
        self._reader = asyncio.create_task(self._read_forever(), name="result-reader")

    async def _connect(self) -> None:
        assert self._redis is not None
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(IDLE_CHANNEL, *self._waiters)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._pubsub is not None:
            await self._pubsub.aclose()
        if self._redis is not None:
            await self._redis.aclose(close_connection_pool=True)

    def _key(self, task_id: str) -> str:
        key = self._key_for(task_id)
        return key.decode() if isinstance(key, bytes) else key

    async def wait(self, task_id: str, timeout: float) -> dict[str, Any]:
        if self._redis is None or self._pubsub is None:
            raise RuntimeError("RedisResultWaiter.start() was not awaited")
        key = self._key(task_id)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        waiters = self._waiters.setdefault(key, set())
        first = not waiters
        waiters.add(future)
        deadline = loop.time() + timeout
        try:
            if first:
                await self._pubsub.subscribe(key)
            while True:
                self._offer(key, await self._redis.get(key))
                remaining = deadline - loop.time()
                if future.done():
                    break
                if remaining <= 0:
                    raise TimeoutError(f"no result for task {task_id} within {timeout:.2f} s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(future), min(self.recheck_s, remaining))
                if future.done():
                    break
            return result_from_meta(task_id, future.result())
        finally:
            waiters.discard(future)
            if not waiters and self._waiters.get(key) is waiters:
                del self._waiters[key]
                with contextlib.suppress(Exception):  # the connection may be away; harmless
                    await self._pubsub.unsubscribe(key)

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
        while True:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message and message.get("type") == "message":
                    channel = message["channel"]
                    self._offer(channel.decode() if isinstance(channel, bytes) else channel,
                                message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: reconnect, rechecks cover the gap
                LOG.warning("result_pubsub_lost", error=str(exc))
                await asyncio.sleep(0.5)
                with contextlib.suppress(Exception):
                    await self._pubsub.aclose()
                with contextlib.suppress(Exception):
                    await self._connect()
