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

3. A worker host that dies whole takes its reserved messages' acknowledgements with it: they wait
   in the unacked hash for the visibility timeout (15 minutes by default) before anyone runs
   them. Here each consumer process holds a lease in Redis (`arag:consumer:<id>`, renewed every
   `lease_s / 4` by a thread) and writes, with each reserved copy, whose it is
   (`<unacked>_owner`). Every live consumer's periodic sweep (kombu's `restore_visible`) also
   puts back at once the reserved messages of consumers whose lease ran out
   (`reclaim_orphans`). A consumer that was only cut off for longer than its lease may then run
   a task that another host runs too; the task writes its result once.

What no consumer can see, because Redis hands a message over (BRPOP) before the consumer writes
its reserved copy: a host that dies between the two takes the message with it. The records know
the request was published and never begun; `held_task_ids` tells the front door's check
(`adaptive_rag.serving.upkeep.republish_lost`) that the broker holds it nowhere.

Selected by `broker_transport` in `workers.celery_app` whenever the broker is Redis (`Transport`;
`SentinelTransport` for a `sentinel://` URL).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Collection, Iterable
from typing import Any

import redis as redis_py
import redis.sentinel as redis_sentinel
from kombu.transport import TRANSPORT_ALIASES, redis, virtual
from kombu.utils.json import dumps

from workers.redis_connections import SENTINEL_SCHEME

logger = logging.getLogger(__name__)
virtual_append = virtual.QoS.append
# Sentinel: how long a new broker connection waits for the Sentinels to name a primary during a
# failover (`MasterWaitingConnection`), asking every `MASTER_POLL_S`.
MASTER_WAIT_S = 3.0
MASTER_POLL_S = 0.1
# Deliveries whose restore failed because the broker was away, per unacked hash (one per broker
# and database): put back by the next channel of this process that connects.
_UNRESTORED: dict[str, set[str]] = {}
_UNRESTORED_LOCK = threading.Lock()


# The consumer lease: how long a consumer's reserved messages stay its own after its last
# renewal (`workers.settings.WorkerSettings.consumer_lease_s` through the transport options).
DEFAULT_LEASE_S = 10.0
LEASE_PREFIX = "arag:consumer:"


class ConsumerLease:
    """This process's lease as a consumer: one Redis key with a time to live, renewed by a daemon
    thread while the process lives. Started by the first message the process reserves (a
    producer never holds one); a forked child starts its own."""

    _lock = threading.Lock()
    _pid: int | None = None
    _name = ""
    _channel: Any = None

    @classmethod
    def name(cls, channel: Any, lease_s: float) -> str:
        """This process's consumer name, its lease written (and its renewal thread started)
        before the first reserved copy names it."""
        with cls._lock:
            cls._channel = channel  # the renewals use the newest channel (one after a reconnect)
            if cls._pid != os.getpid():
                cls._pid = os.getpid()
                cls._name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
                cls._renew(lease_s)
                threading.Thread(target=cls._renew_forever, args=(lease_s,), daemon=True,
                                 name="consumer-lease").start()
        return cls._name

    @classmethod
    def _renew(cls, lease_s: float) -> None:
        # A client of the channel's pool, never `channel.client`: that one's connection carries
        # the consumer's BRPOP, and a command sent between would take its reply.
        with cls._channel.conn_or_acquire() as client:
            client.set(LEASE_PREFIX + cls._name, "1", px=int(lease_s * 1000))

    @classmethod
    def _renew_forever(cls, lease_s: float) -> None:
        pid = os.getpid()
        while cls._pid == pid:
            time.sleep(lease_s / 4)
            try:
                cls._renew(lease_s)
            except Exception as exc:  # noqa: BLE001 - the broker away, a closed channel: next time
                logger.warning("consumer lease not renewed: %s: %s", type(exc).__name__, exc)


def owner_key(channel: Any) -> str:
    """The hash naming the consumer of each reserved copy in `channel.unacked_key`."""
    return f"{channel.unacked_key}_owner"


def reclaim_orphans(channel: Any) -> list[str]:
    """Put back on their queues the reserved messages of consumers whose lease ran out (their
    process or host died, or was cut off from the broker longer than its lease); returns their
    delivery tags."""
    with channel.conn_or_acquire() as client:  # not `channel.client`: see `ConsumerLease._renew`
        owners = client.hgetall(owner_key(channel))
        if not owners:
            return []
        names = sorted({owner.decode() if isinstance(owner, bytes) else str(owner) for owner in owners.values()})
        with client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.exists(LEASE_PREFIX + name)
            alive = {name for name, found in zip(names, pipe.execute()) if found}
    reclaimed = []
    for tag, owner in owners.items():
        if (owner.decode() if isinstance(owner, bytes) else str(owner)) in alive:
            continue
        channel.qos.restore_by_tag(tag, leftmost=True)  # and drops its owner entry
        reclaimed.append(tag.decode() if isinstance(tag, bytes) else str(tag))
    if reclaimed:
        logger.warning("%d reserved message(s) of consumers whose lease ran out put back on their "
                       "queues", len(reclaimed))
    return reclaimed


def held_task_ids(channel: Any, queues: Iterable[str], task_ids: Collection[str]) -> set[str]:
    """Which of `task_ids` the broker holds: waiting on one of `queues` (any priority) or
    reserved by a consumer (the unacked hash). One transaction, so a message moving between the
    two (a restore) is seen in one of them."""
    if not task_ids:
        return set()
    with channel.conn_or_acquire() as client, client.pipeline(transaction=True) as pipe:
        for queue in queues:
            for priority in channel.priority_steps:
                pipe.lrange(channel._q_for_pri(queue, priority), 0, -1)
        pipe.hvals(channel.unacked_key)
        replies = pipe.execute()
    wanted = {task_id: f'"{task_id}"'.encode() for task_id in task_ids}
    held: set[str] = set()
    for payloads in replies:
        for payload in payloads:
            for task_id, needle in wanted.items():
                if task_id not in held and needle in payload:
                    held.add(task_id)
    return held


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
    def append(self, message: Any, delivery_tag: Any) -> None:
        """Reserve `message` as kombu does, naming this consumer as its owner in the same
        transaction."""
        delivery = message.delivery_info
        owner = ConsumerLease.name(self.channel, self.channel.consumer_lease_s)
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}) \
                .hset(self.unacked_key, delivery_tag,
                      dumps([message._raw, delivery["exchange"], delivery["routing_key"]])) \
                .hset(owner_key(self.channel), delivery_tag, owner) \
                .execute()
        virtual_append(self, message, delivery_tag)

    def _remove_from_indices(self, delivery_tag: Any, pipe: Any = None) -> Any:
        return super()._remove_from_indices(delivery_tag, pipe).hdel(owner_key(self.channel), delivery_tag)

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        """kombu's sweep for deliveries older than the visibility timeout, and then the
        reserved messages of consumers whose lease ran out (`reclaim_orphans`)."""
        super().restore_visible(start, num, interval)
        try:
            reclaim_orphans(self.channel)
        except self.channel.connection_errors as exc:
            logger.warning("reserved messages of lost consumers not reclaimed now: %s", exc)

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
    consumer_lease_s: float = DEFAULT_LEASE_S
    from_transport_options = (*redis.Channel.from_transport_options, "consumer_lease_s")

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
    from_transport_options = (*redis.SentinelChannel.from_transport_options, "consumer_lease_s")


class SentinelTransport(redis.SentinelTransport):
    Channel = SentinelChannel


# kombu takes a `sentinel://a;sentinel://b` URL as a list of alternates, and when a connection
# attempt fails it moves to the next one by parsing that URL again, scheme included: the
# `sentinel` scheme would then select kombu's own Sentinel transport, without the fixes above,
# for the rest of the worker's life. Once this transport is in use, the scheme names it.
TRANSPORT_ALIASES[SENTINEL_SCHEME] = "workers.redis_broker:SentinelTransport"
