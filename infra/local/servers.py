"""Throw-away Redis and PostgreSQL servers on loopback, for tests and the demo.

Each context manager starts a real server in a fresh temporary directory on a free 127.0.0.1
port, yields its URL once it accepts connections, and stops it and deletes the directory on exit.

Redis runs as the broker runs in production (`infra/deploy/compose.yaml`): an append-only file
(`appendonly yes`), so queued and unacknowledged messages and stored results survive a restart,
and `maxmemory-policy noeviction`, so a full server refuses writes instead of silently dropping
queued tasks. `LocalRedis` can be stopped and started again on the same port and directory (the
broker-restart tests). PostgreSQL runs without durability (`fsync=off`): it holds test data only.

    python -m infra.local.servers redis|postgres   # run one in the foreground, print its URL
"""

from __future__ import annotations

import os
import signal
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
START_TIMEOUT_S = 30.0
# PostgreSQL refuses to run as root; under root the server runs as one of these users.
PG_USERS = ("postgres", "nobody")


class ServerStartError(RuntimeError):
    """A local server did not come up; the message carries the end of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> None:
    """Ask a child started in its own session to stop with `sig`; its whole process group is
    killed if it is still there after `grace_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _wait_until(ready, what: str, log: Path, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerStartError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001 - not accepting connections yet
            pass
        time.sleep(0.1)
    raise ServerStartError(f"{what} not ready after {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")


# The broker's durability and memory policy, as in production (see the module docstring).
REDIS_BROKER_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec",
                     "--maxmemory-policy", "noeviction", "--save", "")


class LocalRedis:
    """A redis-server on a fixed loopback port and directory that can be stopped and started
    again (its data survives through the append-only file, as a production broker's does)."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.log = workdir / "redis.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             *REDIS_BROKER_ARGS, "--logfile", str(self.log), "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_until(lambda: redis.Redis.from_url(self.url, socket_timeout=1).ping(),
                    "redis-server", self.log, self.proc)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: a clean shutdown (the append-only file is flushed); SIGKILL: a crash."""
        if self.proc is None:
            return
        stop_process(self.proc, sig, grace_s=10.0)
        self.proc = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


@contextmanager
def local_redis_server() -> Iterator[LocalRedis]:
    """A started `LocalRedis` in a fresh directory, stopped and deleted on exit."""
    server = LocalRedis(Path(tempfile.mkdtemp(prefix="arag-redis-")))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


@contextmanager
def local_redis() -> Iterator[str]:
    """A redis-server on a free loopback port; yields `redis://127.0.0.1:PORT/0`."""
    with local_redis_server() as server:
        yield server.url


def _pg_user() -> pwd.struct_passwd | None:
    """The unprivileged account the server runs as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in PG_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise ServerStartError(f"running as root and none of the users {PG_USERS} exists")


def _run_as(user: pwd.struct_passwd | None, args: list[str], log: Path) -> None:
    with log.open("ab") as out:
        proc = subprocess.run(
            args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            user=user.pw_uid if user else None, group=user.pw_gid if user else None,
            extra_groups=[] if user else None, env={**os.environ, "LC_ALL": "C.UTF-8"},
            cwd="/", timeout=120,
        )
    if proc.returncode != 0:
        raise ServerStartError(f"{' '.join(args[:2])} failed ({proc.returncode}):\n{_tail(log)}")


@contextmanager
def local_postgres(database: str = "arag", *, durable: bool = False) -> Iterator[str]:
    """A PostgreSQL cluster (initdb + pg_ctl) on a free loopback port.

    Yields `postgresql+psycopg://arag@127.0.0.1:PORT/<database>` (trust authentication on
    loopback only). Under root the cluster belongs to the `postgres` (or `nobody`) account,
    because PostgreSQL refuses to run as root. Tests want speed over crash safety (fsync and
    synchronous commit off); `durable=True` keeps PostgreSQL's own defaults, as a benchmark
    that speaks for production must.
    """
    import psycopg

    user = _pg_user()
    workdir = Path(tempfile.mkdtemp(prefix="arag-pg-"))
    data, sockets, log = workdir / "data", workdir / "sock", workdir / "postgres.log"
    sockets.mkdir()
    log.touch()
    if user is not None:
        for path in (workdir, sockets, log):
            os.chown(path, user.pw_uid, user.pw_gid)
    port = free_port()
    pg_ctl = str(PG_BIN / "pg_ctl")
    try:
        _run_as(user, [str(PG_BIN / "initdb"), "-D", str(data), "-U", "arag", "--auth=trust",
                       "--no-sync", "-E", "UTF8"], log)
        options = f"-p {port} -c listen_addresses=127.0.0.1 -k {sockets} -c max_connections=200"
        if not durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        _run_as(user, [pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60",
                       "start"], log)
        admin = f"postgresql://arag@127.0.0.1:{port}/postgres"
        _wait_until(lambda: psycopg.connect(admin, connect_timeout=1).close() is None,
                    "postgres", log)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        yield f"postgresql+psycopg://arag@127.0.0.1:{port}/{database}"
    finally:
        if (data / "postmaster.pid").exists():
            try:
                _run_as(user, [pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], log)
            except ServerStartError:
                pass
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str]) -> int:
    servers = {"redis": local_redis, "postgres": local_postgres}
    if len(argv) != 1 or argv[0] not in servers:
        print("usage: python -m infra.local.servers redis|postgres", file=sys.stderr)
        return 2
    with servers[argv[0]]() as url:
        print(url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
