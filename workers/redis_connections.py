"""The one place a `REDIS_URL` becomes Redis clients and Celery settings: one Redis, or a primary
found through Redis Sentinel.

`REDIS_URL` takes either form:

- `redis://[:password@]host:port/db` (also `rediss://`, `unix://`): one server;
- `sentinel://[:password@]host:port[,host:port...]/db?master_name=NAME`: the Sentinels to ask for
  the current primary of the group `NAME` (Celery's own form, `sentinel://h1:p1;sentinel://h2:p2/db`,
  is accepted too, with `?master_name=` on any part). The password is the Redis servers' one.

With Sentinel every client here asks the Sentinels for the primary's address whenever it opens a
connection, and a connection still open to a primary that was demoted fails with a connection
error (redis-py's `SentinelManagedConnection` turns the `READONLY` reply into one), so after a
failover the next command reaches the new primary: Celery's broker (kombu's Sentinel transport)
and result backend (Celery's `SentinelBackend`), the front door's fair share and result waits.

`check_reachable` is the start-up check: a Sentinel list no member of which answers, or that
knows no primary by that name, is a configuration error, not an outage to wait out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from adaptive_rag.errors import ConfigurationError

SENTINEL_SCHEME = "sentinel"
DEFAULT_SENTINEL_PORT = 26379
# Asking one Sentinel where the primary is: a Sentinel that does not answer within this long is
# passed over for the next one.
SENTINEL_TIMEOUT_S = 0.5
# The start-up check asks once (redis-py retries a refused connection with backoff by default).
ONE_TRY = Retry(NoBackoff(), 0)


@dataclass(frozen=True)
class RedisAddress:
    """Where Redis is: `url` for one server, or `sentinels` and `master_name` for a group."""

    url: str = field(repr=False)
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None
    db: int = 0
    password: str | None = field(default=None, repr=False)

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)

    def celery_url(self) -> str:
        """The URL Celery and kombu take (Sentinel: `sentinel://h1:p1/db;sentinel://h2:p2/db`;
        the group's name goes in the transport options, `transport_options()`)."""
        if not self.is_sentinel:
            return self.url
        auth = f":{self.password}@" if self.password else ""
        return ";".join(f"{SENTINEL_SCHEME}://{auth}{host}:{port}/{self.db}" for host, port in self.sentinels)

    def transport_options(self) -> dict[str, Any]:
        """What kombu's Sentinel transport and Celery's Sentinel backend need besides the URL."""
        if not self.is_sentinel:
            return {}
        return {"master_name": self.master_name,
                "sentinel_kwargs": {"socket_timeout": SENTINEL_TIMEOUT_S,
                                    "socket_connect_timeout": SENTINEL_TIMEOUT_S}}

    def describe(self) -> str:
        """For logs and error messages: the addresses, never the password."""
        if not self.is_sentinel:
            parts = urlsplit(self.url)
            return f"Redis at {parts.hostname or parts.path}:{parts.port or 6379}"
        hosts = ", ".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"primary {self.master_name!r} of the Sentinels {hosts}"


def parse(url: str) -> RedisAddress:
    """`REDIS_URL` as a `RedisAddress`; `ConfigurationError` when it is malformed."""
    if not url.startswith(f"{SENTINEL_SCHEME}://"):
        return RedisAddress(url=url)
    sentinels: list[tuple[str, int]] = []
    options: dict[str, str] = {}
    password: str | None = None
    db = 0
    for chunk in url.split(";"):
        if not chunk.startswith(f"{SENTINEL_SCHEME}://"):
            chunk = f"{SENTINEL_SCHEME}://{chunk}"
        parts = urlsplit(chunk)
        options.update(parse_qsl(parts.query))
        netloc = parts.netloc
        if "@" in netloc:
            credentials, netloc = netloc.rsplit("@", 1)
            password = unquote(credentials.partition(":")[2]) or password
        for host_port in filter(None, netloc.split(",")):
            host, _, port = host_port.rpartition(":") if ":" in host_port else (host_port, "", "")
            try:
                sentinels.append((host.strip("[]"), int(port) if port else DEFAULT_SENTINEL_PORT))
            except ValueError:
                raise ConfigurationError(f"REDIS_URL: bad Sentinel address {host_port!r}") from None
        if parts.path.strip("/"):
            try:
                db = int(parts.path.strip("/"))
            except ValueError:
                raise ConfigurationError(f"REDIS_URL: the database is a number, not {parts.path!r}") from None
    if not sentinels:
        raise ConfigurationError("REDIS_URL: a sentinel:// URL names no Sentinel (host:port)")
    master_name = options.get("master_name")
    if not master_name:
        raise ConfigurationError(
            "REDIS_URL: a sentinel:// URL needs the primary's group name, e.g. "
            "sentinel://host1:26379,host2:26379,host3:26379/0?master_name=arag")
    return RedisAddress(url=url, sentinels=tuple(sentinels), master_name=master_name, db=db, password=password)


def _sentinel_kwargs(timeout_s: float | None, retry: Any) -> dict[str, Any]:
    """How a client talks to each Sentinel: one try within the timeout (the next Sentinel of
    the list is the retry)."""
    timeout = SENTINEL_TIMEOUT_S if timeout_s is None else min(timeout_s, SENTINEL_TIMEOUT_S)
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": retry}


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A blocking client of the primary; `options` are redis-py connection options
    (`socket_timeout`, `retry`, ...)."""
    address = parse(url)
    if not address.is_sentinel:
        return redis.Redis.from_url(url, **options)
    sentinel = redis.sentinel.Sentinel(
        address.sentinels, sentinel_kwargs=_sentinel_kwargs(options.get("socket_connect_timeout"), ONE_TRY))
    return sentinel.master_for(address.master_name, db=address.db, password=address.password, **options)


class BlockingSentinelConnectionPool(aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The Sentinel pool with the blocking pool's bound: a burst beyond `max_connections` waits
    for a free connection instead of failing with "Too many connections"."""


def async_client(url: str, *, max_connections: int, **options: Any) -> aioredis.Redis:
    """An asyncio client of the primary over a blocking pool of `max_connections` (waits beyond
    it never time out); `options` are redis-py connection options."""
    address = parse(url)
    if not address.is_sentinel:
        pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=None,
                                                        **options)
        return aioredis.Redis(connection_pool=pool)
    sentinel = aiosentinel.Sentinel(
        address.sentinels,
        sentinel_kwargs=_sentinel_kwargs(options.get("socket_connect_timeout"), AsyncRetry(NoBackoff(), 0)))
    return sentinel.master_for(address.master_name, connection_pool_class=BlockingSentinelConnectionPool,
                               max_connections=max_connections, timeout=None, db=address.db,
                               password=address.password, **options)


def check_reachable(url: str | None, timeout_s: float = 2.0) -> str | None:
    """The start-up check of a Sentinel `REDIS_URL`: at least one Sentinel answers and names a
    primary for the group, and that primary answers. Returns what was found (None: nothing to
    check, one plain Redis is waited for like any broker outage); raises `ConfigurationError`
    with what each Sentinel said otherwise."""
    if not url:
        return None
    address = parse(url)
    if not address.is_sentinel:
        return None
    said: list[str] = []
    for host, port in address.sentinels:
        client = redis.Redis(host=host, port=port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                             retry=ONE_TRY)
        try:
            found = client.sentinel_get_master_addr_by_name(address.master_name)
        except redis.RedisError as exc:
            said.append(f"{host}:{port} does not answer ({type(exc).__name__}: {exc})")
            continue
        finally:
            client.close()
        if not found:
            said.append(f"{host}:{port} knows no primary named {address.master_name!r}")
            continue
        host_found = found[0].decode() if isinstance(found[0], bytes) else str(found[0])
        primary = f"{host_found}:{int(found[1])}"
        client = redis.Redis(host=host_found, port=int(found[1]), db=address.db, password=address.password,
                             socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=ONE_TRY)
        try:
            client.ping()
        except redis.RedisError as exc:
            said.append(f"{host}:{port} names the primary {primary}, which does not answer "
                        f"({type(exc).__name__}: {exc})")
            continue
        finally:
            client.close()
        unanswered = [s for s in said if "does not answer" in s]
        note = f" ({len(unanswered)} Sentinel(s) did not answer: {'; '.join(unanswered)})" if unanswered else ""
        return f"primary {address.master_name!r} at {primary}, named by the Sentinel {host}:{port}{note}"
    raise ConfigurationError(
        f"REDIS_URL: no Sentinel gives a working primary for {address.master_name!r}: " + "; ".join(said))
