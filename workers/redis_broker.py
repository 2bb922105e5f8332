"""The Redis broker transport: kombu's, made safe across a broker restart.

Two gaps of kombu's Redis transport show when the broker restarts under a busy worker:

1. A channel whose connection was already closed (the consumer drops it when the broker goes
   away) builds a fresh connection pool from `transport.client`, which is `None` by then: acking
   or restoring a message on it raises `AttributeError: 'NoneType' object has no attribute
   'hostname'`. That is not one of the transport's connection errors, so Celery treats it as
   unrecoverable and the whole worker exits. Here it is a `redis.ConnectionError`, which every
   caller already handles (the consumer reconnects; a failed ack leaves the message unacked).
2. The messages a worker had reserved when the broker went away cannot be put back then (the
   broker is away), so they wait in the unacked hash for the visibility timeout (15 minutes by
   default) before anyone runs them. Here the first channel that connects again puts them back
   at once, except those a pool process is still running (their own ack removes them when they
   finish). A reserved task the pool had already buffered may then run twice; the task writes
   its result once, so the second run only returns the stored result.

Selected by `broker_transport` in `workers.celery_app` whenever the broker is Redis (`Transport`;
`SentinelTransport` for a `sentinel://` URL).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis as redis_py
import redis.sentinel as redis_sentinel
from kombu.transport import TRANSPORT_ALIASES, redis

from workers.redis_connections import SENTINEL_SCHEME

logger = logging.getLogger(__name__)
# Sentinel: how long a new broker connection waits for the Sentinels to name a primary during a
# failover (`MasterWaitingConnection`), asking every `MASTER_POLL_S`.
MASTER_WAIT_S = 3.0
MASTER_POLL_S = 0.1
# Deliveries whose restore failed because the broker was away, per unacked hash (one per broker
# and database): put back by the next channel of this process that connects.
_UNRESTORED: dict[str, set[str]] = {}
_UNRESTORED_LOCK = threading.Lock()


def _running_delivery_tags() -> set[str]:
    """Delivery tags of the tasks this worker's pool is running now (none outside a worker)."""
    try:
        from celery.worker import state
    except ImportError:  # pragma: no cover - celery is a dependency of the workers
        return set()
    tags = set()
    for request in tuple(state.active_requests):
        tag = getattr(getattr(request, "message", None), "delivery_tag", None)
        if tag is not None:
            tags.add(str(tag))
    return tags


class QoS(redis.QoS):
    def restore_unacked(self, client: Any = None) -> Any:
        """Put back every unacked delivery; when the broker is away, remember them for later."""
        tags = {str(tag) for tag in self._delivered}
        try:
            return super().restore_unacked(client)
        except self.channel.connection_errors:
            if tags:
                with _UNRESTORED_LOCK:
                    _UNRESTORED.setdefault(self.unacked_key, set()).update(tags)
                logger.warning("broker away: %d unacknowledged message(s) go back to their queue "
                               "when it answers again", len(tags))
            raise


class Channel(redis.Channel):
    QoS = QoS
    _sync_client: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # connects (kombu pings the server here)
        self._restore_unrestored()

    def _create_client(self, asynchronous: bool = False) -> Any:
        """One client over the channel's connection pool, reused. Kombu builds a new one for
        every publish and every ack, and redis-py fills a table of reply callbacks in each
        client's constructor. A client over a pool is safe to share between threads; a new pool
        (after a fork or a lost connection) gets a new client."""
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client()
        return client

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection is None or self.connection.client is None:
            raise redis_py.ConnectionError("the broker connection of this channel is closed")
        return super()._connparams(asynchronous=asynchronous)

    def _restore_unrestored(self) -> None:
        """Put back the deliveries a lost connection could not restore (not the running ones)."""
        key = self.unacked_key
        with _UNRESTORED_LOCK:
            pending = _UNRESTORED.pop(key, set())
        if not pending:
            return
        todo = pending - _running_delivery_tags()
        done: set[str] = set()
        try:
            for tag in sorted(todo):
                self.qos.restore_by_tag(tag)
                done.add(tag)
        except self.connection_errors:
            with _UNRESTORED_LOCK:  # away again: the next connection tries the rest
                _UNRESTORED.setdefault(key, set()).update(todo - done)
        if done:
            logger.warning("broker back: %d unacknowledged message(s) of the lost connection put "
                           "back on their queues (%d still running here)", len(done),
                           len(pending) - len(todo))


class Transport(redis.Transport):
    Channel = Channel


class MasterWaitingConnection(redis_sentinel.SentinelManagedConnection):
    """A connection to the primary the Sentinels name that, while they name none (they have
    found the primary down and are electing and promoting a replica), waits up to
    `MASTER_WAIT_S` for one instead of failing at once. A worker's consumer retries a failed
    connect after 2 s, then 4 s more (kombu's steps): without the wait, a failover that ends just
    after an attempt costs the next 4 s."""

    def _connect_retry(self) -> Any:
        deadline = time.monotonic() + MASTER_WAIT_S
        while True:
            try:
                return super()._connect_retry()
            except redis_sentinel.MasterNotFoundError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(MASTER_POLL_S)


class SentinelChannel(Channel, redis.SentinelChannel):
    """The same channel over kombu's Sentinel channel: each new connection goes to the primary
    the Sentinels name (a failover is a lost connection, then a reconnect to the new primary)."""

    connection_class = MasterWaitingConnection


class SentinelTransport(redis.SentinelTransport):
    Channel = SentinelChannel


# kombu takes a `sentinel://a;sentinel://b` URL as a list of alternates, and when a connection
# attempt fails it moves to the next one by parsing that URL again, scheme included: the
# `sentinel` scheme would then select kombu's own Sentinel transport, without the fixes above,
# for the rest of the worker's life. Once this transport is in use, the scheme names it.
TRANSPORT_ALIASES[SENTINEL_SCHEME] = "workers.redis_broker:SentinelTransport"
