"""Failover setups on loopback: Redis under Sentinel, and a PostgreSQL streaming replica.

`LocalRedisSentinel`: a Redis primary, one replica (`replicaof`) and three Sentinels (quorum 2)
watching them, each its own process on its own 127.0.0.1 port and directory. The Sentinels
notice a dead primary after `down_after_ms` (Sentinel's `down-after-milliseconds`), agree, elect
a leader among themselves and promote the replica; clients that ask the Sentinels where the
primary is (`sentinel://` URLs, `workers.redis_connections`) follow it. Every node runs from a
config file in its directory, so the `CONFIG REWRITE` of a failover sticks: a killed primary that
is started again comes back as a replica of the new one.

`LocalPostgresReplica`: a hot standby of a `LocalPostgres`, made by `pg_basebackup -R` (streaming
replication), promoted by `pg_ctl promote`. In production a failover manager (Patroni, or the
operator of a managed service) notices the dead primary and promotes; here the test or the lab
calls `promote()` in its place. Services reach whichever is primary through a multi-host URL with
`target_session_attrs=read-write` (`multi_host_url`).

Both replicate asynchronously, as their defaults do: a write the primary acknowledged in the last
moment before it died may not have reached the replica. See docs/operating.md.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.local.servers import (
    PG_BIN, REDIS_SERVER, LocalPostgres, LocalRedis, LocalServer, ServerStartError, Started, _run_as, free_port,
)

REDIS_SENTINEL = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
MASTER_NAME = "arag"
# How long a primary must stay silent before a Sentinel deems it down. Sentinel's own default is
# 30 s; 1 s suits loopback (a production network wants more: a GC pause or a slow disk must not
# cause a failover).
DOWN_AFTER_MS = 1000
# The bound on one failover attempt; a split vote among the Sentinels is retried after twice this.
FAILOVER_TIMEOUT_MS = 5000


def _redis(port: int, timeout: float = 1.0, address: str = "127.0.0.1") -> Any:
    import redis

    return redis.Redis(host=address, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
                       decode_responses=True)


class LocalRedisNode(LocalRedis):
    """A `LocalRedis` (the broker's persistence and memory policy) started from its own config
    file, which Sentinel rewrites when it changes the node's role; `replica_of`: the port of the
    primary it replicates at first."""

    def __init__(self, workdir: Path, port: int | None = None, *, replica_of: int | None = None,
                 log: Path | None = None) -> None:
        super().__init__(workdir, port, persistent=True, log=log)
        self.replica_of = replica_of  # the primary's port, on this node's address
        self.config = self.workdir / "redis.conf"

    def prepare(self) -> None:
        if self.config.exists():  # what the last run, or Sentinel, left there
            return
        lines = [f"port {self.port}", f"bind {self.address}", f'dir "{self.workdir}"', "daemonize no",
                 "appendonly yes", "appendfsync everysec", "maxmemory-policy noeviction", 'save ""']
        if self.address != "127.0.0.1":  # on a host: other hosts are clients too
            lines.append("protected-mode no")
        if self.replica_of is not None:
            lines.append(f"replicaof {self.address} {self.replica_of}")
        self.config.write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        return [REDIS_SERVER, str(self.config)]

    def role(self) -> str:
        """"master" or "slave", as the node itself says."""
        client = _redis(self.port, address=self.address)
        try:
            return str(client.info("replication")["role"])
        finally:
            client.close()


class LocalSentinel(LocalServer):
    """One `redis-sentinel` watching the primary `master_name` at first on `master_port`."""

    name = "sentinel"

    def __init__(self, workdir: Path, port: int | None = None, *, master_name: str, master_port: int,
                 quorum: int, down_after_ms: int, failover_timeout_ms: int, log: Path | None = None) -> None:
        super().__init__(workdir, port, log=log)
        self.master_name = master_name
        self.master_port = master_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.config = self.workdir / "sentinel.conf"

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.port}"

    def prepare(self) -> None:
        if self.config.exists():  # Sentinel keeps its state (current primary, peers) in it
            return
        name = self.master_name
        self.config.write_text("\n".join([
            f"port {self.port}", f"bind {self.address}", f'dir "{self.workdir}"', "daemonize no",
            *(["protected-mode no"] if self.address != "127.0.0.1" else []),
            f"sentinel monitor {name} {self.address} {self.master_port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]) + "\n")

    def command(self) -> list[str]:
        return [REDIS_SENTINEL, str(self.config)]

    def ready(self) -> bool:
        client = _redis(self.port, address=self.address)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def master(self) -> dict[str, Any]:
        """`SENTINEL MASTER <name>`: the primary's address, flags and counts as this one sees it."""
        client = _redis(self.port, address=self.address)
        try:
            return client.sentinel_master(self.master_name)
        finally:
            client.close()


class LocalRedisSentinel(Started):
    """A Redis primary, one replica and `sentinels` Sentinels (quorum `quorum`) on loopback.

    `url` is the `sentinel://` URL the services take as `REDIS_URL`. `kill_primary()` crashes the
    current primary; `wait_for_failover()` returns once the Sentinels name and serve a new one.
    A context manager: starts on entry, stops everything (and deletes a temporary directory) on
    exit.
    """

    def __init__(self, workdir: Path | None = None, *, master_name: str = MASTER_NAME, sentinels: int = 3,
                 quorum: int = 2, down_after_ms: int = DOWN_AFTER_MS,
                 failover_timeout_ms: int = FAILOVER_TIMEOUT_MS) -> None:
        self.owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="arag-sentinel-")).resolve()
        self.master_name = master_name
        self.down_after_ms = down_after_ms
        first = LocalRedisNode(self.workdir / "redis-1")
        self.nodes = [first, LocalRedisNode(self.workdir / "redis-2", replica_of=first.port)]
        self.sentinels = [
            LocalSentinel(self.workdir / f"sentinel-{n}", master_name=master_name, master_port=first.port,
                          quorum=quorum, down_after_ms=down_after_ms, failover_timeout_ms=failover_timeout_ms)
            for n in range(1, sentinels + 1)
        ]

    def on_host(self, host: Any) -> LocalRedisSentinel:
        """Every node and Sentinel on `host` (an `infra.local.hosts.Host`), listening on its
        address; call before `start()`."""
        for server in self.processes:
            server.on_host(host)
        return self

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.address}:{s.port}" for s in self.sentinels)
        return f"sentinel://{hosts}/0?master_name={self.master_name}"

    @property
    def processes(self) -> list[LocalServer]:
        return [*self.nodes, *self.sentinels]

    # --- life cycle -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> None:
        """Start the nodes, then the Sentinels; return once the replica is in sync and every
        Sentinel knows the primary, the replica and the other Sentinels (a failover needs all)."""
        for node in self.nodes:
            node.start()
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_settled(timeout_s)

    def wait_settled(self, timeout_s: float = 30.0) -> None:
        """Until one primary serves with a replica in sync, and every Sentinel agrees on it and
        sees the replica and all the other Sentinels."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                views = [s.master() for s in self.sentinels]
                ports = {int(v["port"]) for v in views}
                primary = self.node_on(ports.pop()) if len(ports) == 1 else None
                if (primary is not None and "s_down" not in views[0]["flags"]
                        and all(v["num-slaves"] >= len(self.nodes) - 1 for v in views)
                        and all(v["num-other-sentinels"] == len(self.sentinels) - 1 for v in views)
                        and self._in_sync(primary)):
                    return
                last = views
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
            time.sleep(0.2)
        raise ServerStartError(f"Sentinel setup not settled after {timeout_s:.0f} s: {last}")

    def _in_sync(self, primary: LocalRedisNode) -> bool:
        """Every other running node is a replica of `primary` with its link up."""
        for node in self.nodes:
            if node is primary or not node.is_running():
                continue
            client = _redis(node.port, address=node.address)
            try:
                replication = client.info("replication")
            finally:
                client.close()
            if (replication.get("role") != "slave" or int(replication.get("master_port", 0)) != primary.port
                    or replication.get("master_link_status") != "up"):
                return False
        return True

    def switches(self) -> list[str]:
        """The failovers the Sentinels carried out so far, as `<old port> -> <new port>` (from
        their `+switch-master` log lines; each Sentinel logs every switch, so they are merged)."""
        seen: list[str] = []
        for sentinel in self.sentinels:
            if not sentinel.log.exists():
                continue
            events = [line.split("+switch-master", 1)[1].split()  # name, old host, old port, new host, new port
                      for line in sentinel.log.read_text(errors="replace").splitlines() if "+switch-master" in line]
            mine = [f"{event[2]} -> {event[4]}" for event in events if len(event) >= 5]
            if len(mine) > len(seen):
                seen = mine
        return seen

    def close(self) -> None:
        try:
            for server in (*self.sentinels, *self.nodes):
                try:
                    server.stop("fast")
                finally:
                    if server.proc is not None:
                        server.stop("kill")
        finally:
            if self.owns_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    # --- who is primary ---------------------------------------------------------------------------
    def node_on(self, port: int) -> LocalRedisNode | None:
        return next((n for n in self.nodes if n.port == port), None)

    def primary_port(self) -> int:
        """The primary's port as the first answering Sentinel names it."""
        errors = []
        for sentinel in self.sentinels:
            client = _redis(sentinel.port, address=sentinel.address)
            try:
                address = client.sentinel_get_master_addr_by_name(self.master_name)
                if address:
                    return int(address[1])
            except Exception as exc:  # noqa: BLE001 - that one is away: ask the next
                errors.append(exc)
            finally:
                client.close()
        raise ServerStartError(f"no Sentinel names a primary for {self.master_name!r}: {errors}")

    def primary(self) -> LocalRedisNode:
        node = self.node_on(self.primary_port())
        if node is None:
            raise ServerStartError("the Sentinels name a primary that is not one of this setup's nodes")
        return node

    def kill_primary(self) -> LocalRedisNode:
        """SIGKILL to the current primary (a crash); returns its node (`start()` it again later:
        the Sentinels make it a replica of the new primary)."""
        node = self.primary()
        node.kill()
        return node

    def wait_for_failover(self, old_port: int, timeout_s: float = 30.0) -> float:
        """Seconds until a majority of the Sentinels name a primary other than `old_port` and that
        node says it is a master."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            moved = []
            for sentinel in self.sentinels:
                if not sentinel.is_running():
                    continue
                try:
                    moved.append(int(sentinel.master()["port"]))
                except Exception:  # noqa: BLE001 - a Sentinel busy or away: ask again
                    continue
            new = [p for p in moved if p != old_port]
            if len(new) > len(self.sentinels) // 2:
                node = self.node_on(new[0])
                try:
                    if node is not None and node.role() == "master":
                        return time.monotonic() - started
                except Exception:  # noqa: BLE001 - not answering yet
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"no failover away from port {old_port} within {timeout_s:.0f} s")


# --- PostgreSQL -------------------------------------------------------------------------------------


class LocalPostgresReplica(LocalPostgres):
    """A hot standby of `primary` (streaming replication from a `pg_basebackup -R` copy), same
    database, durability and connection limit; `promote()` makes it a primary (`pg_ctl promote`,
    what Patroni runs on failover). After a promotion it stays a primary across restarts."""

    name = "postgres-replica"

    def __init__(self, primary: LocalPostgres, workdir: Path | None = None, port: int | None = None, *,
                 log: Path | None = None) -> None:
        super().__init__(workdir, port, database=primary.database, durability=primary.durability,
                         max_connections=primary.max_connections, log=log)
        self.primary = primary

    def prepare(self) -> None:
        self.prepare_directories()
        if not (self.data / "PG_VERSION").exists():
            if not self.primary.is_running():
                raise ServerStartError("a replica is copied from a running primary: start it first")
            _run_as(self.user, [str(PG_BIN / "pg_basebackup"), "-h", self.primary.address, "-p", str(self.primary.port),
                                "-U", "arag", "-D", str(self.data), "-R", "-X", "stream", "--checkpoint=fast",
                                "--no-sync"], self.log)

    def after_start(self) -> None:
        if not self.in_recovery():  # promoted: create the database as any primary would
            super().after_start()

    def in_recovery(self) -> bool:
        """True while it is a standby."""
        import psycopg

        with psycopg.connect(self.admin_url, connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    def wait_caught_up(self, timeout_s: float = 30.0) -> None:
        """Until the replica has replayed everything the primary had written when this was
        called."""
        import psycopg

        with psycopg.connect(self.primary.admin_url, connect_timeout=2) as conn:
            target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with psycopg.connect(self.admin_url, connect_timeout=2) as conn:
                done = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(target),)).fetchone()
            if done and done[0]:
                return
            time.sleep(0.05)
        raise TimeoutError(f"the replica did not replay up to {target} within {timeout_s:.0f} s")

    def promote(self, timeout_s: float = 30.0) -> float:
        """`pg_ctl promote`, waiting until it accepts writes; the seconds it took."""
        started = time.monotonic()
        _run_as(self.user, [str(PG_BIN / "pg_ctl"), "promote", "-D", str(self.data), "-w",
                            "-t", str(int(timeout_s))], self.log)
        return time.monotonic() - started


def multi_host_url(servers: Sequence[LocalPostgres], database: str | None = None,
                   target_session_attrs: str = "read-write") -> str:
    """A libpq multi-host URL over `servers` (tried in order; `read-write`: the first one that
    accepts writes), the form `DATABASE_URL` takes for a primary with replicas."""
    hosts = ",".join(f"{s.address}:{s.port}" for s in servers)
    name = database or servers[0].database
    return f"postgresql://arag@{hosts}/{name}?target_session_attrs={target_session_attrs}"


__all__ = ["DOWN_AFTER_MS", "FAILOVER_TIMEOUT_MS", "MASTER_NAME", "LocalPostgresReplica", "LocalRedisNode",
           "LocalRedisSentinel", "LocalSentinel", "free_port", "multi_host_url"]
