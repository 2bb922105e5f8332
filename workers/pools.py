"""Start and stop the tier worker pools as real `celery worker` processes.

One pool per queue (`tier-a`, `tier-b`, `tier-c`, `shadow`), each with its own concurrency and
prefetch from `Settings` (C: prefetch 1) and hostname `tier-x@%h`, so each tier scales on its own
queue depth and a backlog of slow C tasks never delays A. Used by the tests, the demo, and in the
foreground:

    python -m workers.pools                 # all pools, Ctrl-C stops them
    python -m workers.pools --pools A,C     # some of them
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

from adaptive_rag.contracts import QUEUE_FOR_TIER, SHADOW_QUEUE, SHARED_QUEUE
from adaptive_rag.settings import Settings, as_environment
from workers.settings import WorkerSettings

REPO = Path(__file__).resolve().parents[1]
# One pool per tier queue, plus the shadow pool; `shared` is the comparison setup's one pool for
# every tier (needs `ARAG_SHARED_QUEUE`, see WorkerSettings).
POOL_QUEUES = {**{tier.value: queue for tier, queue in QUEUE_FOR_TIER.items()},
               "shadow": SHADOW_QUEUE, "shared": SHARED_QUEUE}
READY_MARK = " ready."
READY_TIMEOUT_S = 120.0


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
        migrate: bool = True,
    ) -> None:
        """`settings` and `library` (retrieval, LLM, records) are handed to the worker processes
        through their environment."""
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
        self.pools: dict[str, Pool] = {}

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
            "-Q", queue, "-n", f"{queue}@%h", "-P", self.pool_impl,
            "--concurrency", str(self.settings.pool_concurrency(name)),
            "--prefetch-multiplier", str(self.settings.pool_prefetch(name)),
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", self.loglevel,
        ]

    def start(self, wait: bool = True) -> None:
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
            process = subprocess.Popen(
                self.command(name), env=self.env(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        pool = Pool(name, POOL_QUEUES[name], process, log_path, offset)
        self.pools[name] = pool
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

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown (finish current tasks), then cold, then SIGKILL for what is left."""
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
        print("workers ready; Ctrl-C stops them", flush=True)
        while not stop and all(p.alive() for p in pools.pools.values()):
            time.sleep(0.5)
        dead = [name for name, p in pools.pools.items() if not p.alive()]
        if dead:
            print(f"pool(s) {', '.join(dead)} exited; stopping the others", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
