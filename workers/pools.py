"""Start and stop the tier worker pools as real `celery worker` processes.

One pool per queue (`tier-a`, `tier-b`, `tier-c`, `shadow`), each with its own concurrency and
prefetch from `Settings` (C: prefetch 1) and hostname `tier-x@%h`, so each tier scales on its own
queue depth and a backlog of slow C tasks never delays A. Used by the tests, the demo, and in the
foreground:

    python -m workers.pools                 # all pools, Ctrl-C stops them
    python -m workers.pools --pools A,C     # some of them

In the foreground (and wherever `supervise_once` or `start_supervisor` runs) a pool that exits is
started again on its own, after a backoff that doubles with each quick crash; the other pools
keep running. One crashed tier never takes the others down. With the Redis broker, the messages
the dead pool had reserved go back to its queue at once (`restore_reserved`), instead of after the
broker's visibility timeout (15 minutes by default), so its in-flight requests are not stranded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from pydantic_settings import BaseSettings

from adaptive_rag.contracts import QUEUE_FOR_TIER, SHADOW_QUEUE, SHARED_QUEUE
from adaptive_rag.logs import configure_logging
from adaptive_rag.settings import Settings, as_environment
from workers.settings import WorkerSettings

REPO = Path(__file__).resolve().parents[1]
# One pool per tier queue, plus the shadow pool; `shared` is the comparison setup's one pool for
# every tier (needs `ARAG_SHARED_QUEUE`, see WorkerSettings).
POOL_QUEUES = {**{tier.value: queue for tier, queue in QUEUE_FOR_TIER.items()},
               "shadow": SHADOW_QUEUE, "shared": SHARED_QUEUE}
READY_MARK = " ready."
READY_TIMEOUT_S = 120.0
LOG = structlog.get_logger("workers.pools")


@dataclass(frozen=True)
class RestartPolicy:
    """When a pool that exited is started again: after `first_backoff_s`, doubling with each
    crash up to `max_backoff_s`; a pool that stayed up `stable_after_s` starts from the first
    backoff again (a crash loop slows down, a rare crash is repaired at once)."""

    first_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    stable_after_s: float = 60.0

    def backoff(self, quick_crashes: int) -> float:
        """The wait before the restart that follows `quick_crashes` crashes in a row (>= 1)."""
        return min(self.max_backoff_s, self.first_backoff_s * 2 ** max(0, quick_crashes - 1))


@dataclass
class PoolHealth:
    """What the supervisor knows about one pool between checks."""

    started_at: float
    restarts: int = 0
    quick_crashes: int = 0
    restart_at: float | None = None  # set while a restart is pending
    exit_codes: list[int] = field(default_factory=list)


def restore_reserved(channel: Any, queue: str, before: float) -> list[str]:
    """Put the messages reserved from `queue` before `before` (a UNIX time) back on it; returns
    their delivery tags.

    `channel` is a kombu Redis channel: reserved (unacknowledged) messages sit in its unacked hash
    as `[payload, exchange, routing_key]`, indexed by delivery time, until acknowledged or until
    the visibility timeout. Called when the pool consuming `queue` died: its messages can no
    longer be acknowledged by anyone. A worker elsewhere consuming the same queue may hold some of
    them too; those run twice, and the task writes its result once.
    """
    client = channel.client
    restored = []
    for tag, raw in client.hgetall(channel.unacked_key).items():
        try:
            _payload, _exchange, routing_key = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if routing_key != queue:
            continue
        delivered = client.zscore(channel.unacked_index_key, tag)
        if delivered is None or float(delivered) > before:
            continue
        channel.qos.restore_by_tag(tag, leftmost=True)
        restored.append(tag.decode() if isinstance(tag, bytes) else str(tag))
    return restored


def process_env(
    *settings: BaseSettings, base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a child process (a pool, the front door) that reads `settings` back:
    `base` (default: this process's) with their variables set or removed, the repository on
    PYTHONPATH, and `extra` last."""
    env = dict(os.environ if base is None else base)
    for key, value in as_environment(*settings).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


@dataclass
class Pool:
    """One running `celery worker` process (with its prefork children)."""

    name: str
    queue: str
    process: subprocess.Popen
    log_path: Path
    log_offset: int = 0  # where this start's lines begin in the (appended) log

    @property
    def pid(self) -> int:
        return self.process.pid

    def child_pids(self) -> list[int]:
        """The pool's executor processes (prefork children of the worker)."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        try:
            return [int(pid) for pid in children.read_text().split()]
        except OSError:
            return []

    def alive(self) -> bool:
        return self.process.poll() is None


class WorkerPools:
    """The tier pools as subprocesses; a context manager that starts them and waits until each
    worker reports ready, and stops them (warm, then cold, then SIGKILL) on exit."""

    def __init__(
        self, settings: WorkerSettings | None = None, pools: Iterable[str] = ("A", "B", "C", "shadow"),
        *, library: Settings | None = None, pool_impl: str = "prefork", log_dir: Path | None = None,
        extra_env: Mapping[str, str] | None = None, loglevel: str = "INFO",
        migrate: bool = True, wrap: Callable[[list[str]], list[str]] | None = None,
        node_host: str = "%h",
    ) -> None:
        """`settings` and `library` (retrieval, LLM, records) are handed to the worker processes
        through their environment. `wrap`: how each worker command runs elsewhere (another host's
        network namespace, `infra.local.hosts.Host.wrap`; it must exec the command, so a pool's
        pid stays its worker's); `node_host`: the host part of the workers' node names (`%h`,
        the machine's name; pools of one queue on several hosts need distinct ones)."""
        self.settings = settings or WorkerSettings()
        self.library = library or Settings()
        self.pool_names = list(pools)
        unknown = set(self.pool_names) - set(POOL_QUEUES)
        if unknown:
            raise ValueError(f"unknown pools {sorted(unknown)}; choose from {list(POOL_QUEUES)}")
        if "shared" in self.pool_names and not self.settings.shared_queue:
            raise ValueError("the shared pool needs shared_queue=True (ARAG_SHARED_QUEUE)")
        self.pool_impl = pool_impl
        self.log_dir = (log_dir or Path("var/log/workers")).resolve()
        self.extra_env = dict(extra_env or {})
        self.loglevel = loglevel
        self.migrate = migrate
        self.wrap = wrap
        self.node_host = node_host
        self.pools: dict[str, Pool] = {}
        self.health: dict[str, PoolHealth] = {}
        self._supervisor: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.RLock()  # start/stop/restart of pools, from any thread

    @property
    def restarts(self) -> dict[str, int]:
        """How often each pool was started again after it exited."""
        return {name: h.restarts for name, h in self.health.items()}

    # --- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> WorkerPools:
        self.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        return process_env(self.settings, self.library, extra=self.extra_env)

    def command(self, name: str) -> list[str]:
        queue = POOL_QUEUES[name]
        return [
            sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker",
            "-Q", queue, "-n", f"{queue}@{self.node_host}", "-P", self.pool_impl,
            "--concurrency", str(self.settings.pool_concurrency(name)),
            "--prefetch-multiplier", str(self.settings.pool_prefetch(name)),
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", self.loglevel,
        ]

    def start(self, wait: bool = True) -> None:
        self._stopping.clear()
        if self.migrate:
            from adaptive_rag.storage import upgrade_database

            upgrade_database(self.library.database_url)
        for name in self.pool_names:
            self.start_pool(name, wait=False)
        if wait:
            for name in self.pool_names:
                self.wait_ready(name)

    def start_pool(self, name: str, wait: bool = True) -> Pool:
        """Start (or start again, after a crash) one pool."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{POOL_QUEUES[name]}.log"
        with log_path.open("ab") as log:
            log.write(f"--- starting {' '.join(self.command(name))}\n".encode())
            log.flush()
            offset = log.tell()
            command = self.command(name)
            process = subprocess.Popen(
                self.wrap(command) if self.wrap is not None else command, env=self.env(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        pool = Pool(name, POOL_QUEUES[name], process, log_path, offset)
        with self._lock:
            self.pools[name] = pool
            health = self.health.setdefault(name, PoolHealth(started_at=time.monotonic()))
            health.started_at, health.restart_at = time.monotonic(), None
        if wait:
            self.wait_ready(name)
        return pool

    def wait_ready(self, name: str, timeout: float = READY_TIMEOUT_S) -> None:
        """Until the worker logs `... ready.` (connected to the broker, consuming its queue)."""
        pool = self.pools[name]
        offset = pool.log_offset
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with pool.log_path.open("rb") as log:
                log.seek(offset)
                if READY_MARK.encode() in log.read():
                    return
            if not pool.alive():
                raise RuntimeError(
                    f"worker pool {name} exited with {pool.process.returncode}:\n"
                    f"{pool.log_path.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.2)
        raise RuntimeError(f"worker pool {name} not ready after {timeout:.0f} s ({pool.log_path})")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one pool's whole process group at once, as a crashed machine would."""
        pool = self.pools[name]
        try:
            os.killpg(pool.pid, sig)
        except ProcessLookupError:
            pass
        pool.process.wait(timeout=30)

    # --- supervision -------------------------------------------------------------------------
    def supervise_once(self, policy: RestartPolicy = RestartPolicy(),
                       now: Callable[[], float] = time.monotonic) -> list[str]:
        """Look at every pool once: a pool that exited gets a restart scheduled after its
        backoff, and one whose backoff passed is started again (without waiting for it to be
        ready). Returns the pools started in this call."""
        started: list[str] = []
        with self._lock:
            if self._stopping.is_set():
                return started
            for name, pool in list(self.pools.items()):
                health = self.health[name]
                if health.restart_at is None:
                    if pool.alive():
                        if now() - health.started_at >= policy.stable_after_s:
                            health.quick_crashes = 0
                        continue
                    code = pool.process.returncode
                    health.exit_codes.append(code)
                    up_s = now() - health.started_at
                    health.quick_crashes = 1 if up_s >= policy.stable_after_s else health.quick_crashes + 1
                    backoff = policy.backoff(health.quick_crashes)
                    health.restart_at = now() + backoff
                    self._reap(pool)
                    LOG.error("pool_exited", pool=name, queue=pool.queue, exit_code=code,
                              up_s=round(up_s, 1), restart_in_s=backoff,
                              restarts=health.restarts, log=str(pool.log_path))
                    self._restore_reserved(pool.queue)
                elif now() >= health.restart_at:
                    new = self.start_pool(name, wait=False)
                    health.restarts += 1  # counted once the new pool is in `pools`: readers see both
                    started.append(name)
                    LOG.warning("pool_restarted", pool=name, queue=new.queue, pid=new.pid,
                                restarts=health.restarts)
        return started

    def start_supervisor(self, poll_s: float = 0.5, policy: RestartPolicy = RestartPolicy()) -> None:
        """Run `supervise_once` every `poll_s` on a daemon thread until `stop()`."""
        if self._supervisor is not None and self._supervisor.is_alive():
            return

        def loop() -> None:
            while not self._stopping.wait(poll_s):
                try:
                    self.supervise_once(policy)
                except Exception as exc:  # noqa: BLE001 - keep supervising the other pools
                    LOG.error("supervisor_error", error=f"{type(exc).__name__}: {exc}")

        self._supervisor = threading.Thread(target=loop, name="pool-supervisor", daemon=True)
        self._supervisor.start()

    def _restore_reserved(self, queue: str) -> None:
        """The dead pool's reserved messages back on its queue (Redis broker only)."""
        if not self.settings.redis_url:
            return
        try:
            from workers.celery_app import create_app

            with create_app(self.settings, results=False).connection_for_write() as connection:
                tags = restore_reserved(connection.default_channel, queue, time.time())
            LOG.warning("reserved_messages_restored", queue=queue, messages=len(tags))
        except Exception as exc:  # noqa: BLE001 - they come back after the visibility timeout
            LOG.error("reserved_messages_not_restored", queue=queue, error=f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _reap(pool: Pool) -> None:
        """A pool's main process is gone: its prefork children (which can no longer ack
        anything) go with it; their messages come back after the visibility timeout."""
        try:
            os.killpg(pool.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown (finish current tasks), then cold, then SIGKILL for what is left."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=10)
            self._supervisor = None
        with self._lock:
            self._stop_all(timeout)

    def _stop_all(self, timeout: float) -> None:
        running = [p for p in self.pools.values() if p.alive()]
        for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
            for pool in running:
                try:  # the main process shuts its pool children down itself; SIGKILL takes all
                    if sig == signal.SIGKILL:
                        os.killpg(pool.pid, sig)
                    else:
                        os.kill(pool.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            for pool in running:
                try:
                    pool.process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            running = [p for p in running if p.alive()]
            if not running:
                break
        for pool in self.pools.values():  # reap children the group signal left behind
            try:
                os.killpg(pool.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.pools.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", default="A,B,C,shadow", help="comma-separated: A,B,C,shadow")
    parser.add_argument("--pool-impl", default="prefork", help="celery pool: prefork | solo")
    args = parser.parse_args(argv)
    configure_logging()
    from adaptive_rag.errors import ConfigurationError
    from workers.startup import check_backing_services

    settings = WorkerSettings()
    try:
        found = check_backing_services(Settings().database_url, settings.redis_url)
    except ConfigurationError as exc:
        print(f"worker pools not started: {exc}", file=sys.stderr, flush=True)
        return 2
    LOG.info("startup_checks", **found)
    pools = WorkerPools(pools=[p.strip() for p in args.pools.split(",") if p.strip()],
                        pool_impl=args.pool_impl)
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with pools:
        for name, pool in pools.pools.items():
            print(f"pool {name}: queue {pool.queue}, pid {pool.pid}, "
                  f"concurrency {pools.settings.pool_concurrency(name)}, "
                  f"prefetch {pools.settings.pool_prefetch(name)}, log {pool.log_path}", flush=True)
        print("workers ready; a pool that exits is started again; Ctrl-C stops them", flush=True)
        while not stop:
            pools.supervise_once()
            time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
