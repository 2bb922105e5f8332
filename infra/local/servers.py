"""Local Redis, PostgreSQL and OpenSearch servers on loopback, for tests, the demo and the lab.

Each server is a `LocalServer`: one real server process (its own session, so a terminal's Ctrl-C
reaches only the helper) on a fixed 127.0.0.1 port and data directory. It can be stopped cleanly
or crashed (`stop("kill")`: SIGKILL to all its processes at once) and started again on the same port
with the same data, any number of times. A server made without a directory gets a fresh temporary
one that `close()` deletes; a directory given to it is kept and reused by the next start.

Redis runs as the broker runs in production (`infra/deploy/compose.yaml`): an append-only file
(`appendonly yes`), so queued and unacknowledged messages and stored results survive a restart,
and `maxmemory-policy noeviction`, so a full server refuses writes instead of silently dropping
queued tasks (`persistent=False`: no persistence at all). PostgreSQL's durability is chosen per
use (`Durability`): tests want speed, the fault campaign commits that survive a crash of the
server, benchmarks that speak for production PostgreSQL's defaults. OpenSearch nodes live in
`infra.local.opensearch`.

    python -m infra.local redis|postgres|opensearch [--port N] [--dir DIR]

runs one in the foreground and prints its URL (`infra/local/__main__.py`).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, Self

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
# PostgreSQL refuses to run as root; under root the server runs as one of these users.
PG_USERS = ("postgres", "nobody")

StopMode = Literal["smart", "fast", "immediate", "kill"]
# How much a PostgreSQL commit survives: "off" nothing (fsync, synchronous commit and full-page
# writes off: the fastest, for tests; a crash of the server loses the last commits);
# "server-crash" a crash of the server process (synchronous commit on, fsync off: the WAL is in
# the page cache, only a failing machine loses it); "full" PostgreSQL's own defaults.
Durability = Literal["off", "server-crash", "full"]
DURABILITY_OPTIONS: dict[str, tuple[str, ...]] = {
    "off": ("fsync=off", "synchronous_commit=off", "full_page_writes=off"),
    "server-crash": ("fsync=off", "synchronous_commit=on"),
    "full": (),
}


def _find_pg_bin() -> Path:
    """`PG_BIN`, else the newest Debian-style /usr/lib/postgresql/N/bin, else where `pg_ctl` is."""
    if os.environ.get("PG_BIN"):
        return Path(os.environ["PG_BIN"])
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                   key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _find_pg_bin()


class ServerStartError(RuntimeError):
    """A local server did not come up; the message carries the end of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process, from /proc."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the command name is in parentheses and may hold spaces: split after the last one
            state, ppid = stat.read_text().rpartition(")")[2].split()[:2]
            table[int(stat.parent.name)] = (int(ppid), state)
        except (OSError, ValueError):
            continue
    return table


def _family(pid: int) -> list[int]:
    """A process and all its live descendants. PostgreSQL's children each start a session of
    their own, so a process group does not hold them all; the parent links do."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for child, (parent, state) in table.items():
        if state != "Z":
            children.setdefault(parent, []).append(child)
    family, todo = [], [pid]
    while todo:
        current = todo.pop()
        family.append(current)
        todo.extend(children.get(current, ()))
    return family


def _wait_gone(pids: Sequence[int], timeout_s: float) -> bool:
    """Wait until none of `pids` runs (gone, or a zombie nobody reaps)."""
    deadline = time.monotonic() + timeout_s
    while True:
        table = _processes()
        if not any(pid in table and table[pid][1] != "Z" for pid in pids):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _kill_family(proc: subprocess.Popen) -> list[int]:
    """SIGKILL to a child and every descendant of it, frozen first (SIGSTOP) so that it forks
    nothing after the list of its processes was taken; the pids killed."""
    try:
        os.kill(proc.pid, signal.SIGSTOP)
    except ProcessLookupError:
        return []
    family = _family(proc.pid)
    for pid in reversed(family):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return family


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> None:
    """Stop a child with `sig`; SIGKILL goes to it and all its descendants at once (a crash).
    What is still there after `grace_s` is killed the same way. On return none of its processes
    runs any more."""
    family = _family(proc.pid) if proc.poll() is None else []
    try:
        if proc.poll() is None:
            if sig == signal.SIGKILL:
                family = _kill_family(proc) or family
            else:
                proc.send_signal(sig)
            proc.wait(timeout=grace_s)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    if proc.poll() is not None and _wait_gone(family, 10.0 if sig == signal.SIGKILL else 2.0):
        return
    if proc.poll() is None:
        family = sorted(set(family) | set(_kill_family(proc)))
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)
    _wait_gone(family, 10.0)


def tail_of(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _wait_until(ready: Callable[[], Any], what: str, log: Path, proc: subprocess.Popen | None = None,
                timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerStartError(f"{what} exited with {proc.returncode}:\n{tail_of(log)}")
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001 - not accepting connections yet
            pass
        time.sleep(0.1)
    raise ServerStartError(f"{what} not ready after {timeout_s:.0f} s:\n{tail_of(log)}")


class Started:
    """A context manager over `start()` and `close()`: started on enter (closed again when the
    start fails part way), closed on exit."""

    def start(self) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class LocalServer(Started):
    """One server process on a fixed loopback port and data directory, restartable on both.

    Subclasses say how the server is started (`command`), when it serves (`ready`) and which
    signal each stop mode sends (`stop_signals`; every server has "fast", a clean shutdown, and
    "kill", a crash). `start()` after any stop serves the same port and data again. As a context
    manager it starts on entry and `close()`s on exit.
    """

    name: ClassVar[str]
    stop_signals: ClassVar[Mapping[str, int]] = {"fast": signal.SIGTERM, "kill": signal.SIGKILL}
    start_timeout_s: ClassVar[float] = 30.0
    stop_grace_s: ClassVar[float] = 30.0
    start_attempts: ClassVar[int] = 3

    def __init__(self, workdir: Path | None = None, port: int | None = None, *,
                 log: Path | None = None) -> None:
        self.owns_workdir = workdir is None
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix=f"arag-{self.name}-"))
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.log = log or self.workdir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None
        # where it listens: loopback, or the address of the host it runs on (`on_host`)
        self.address = "127.0.0.1"
        self.host: Any = None  # infra.local.hosts.Host

    def on_host(self, host: Any) -> Self:
        """Run on `host` (an `infra.local.hosts.Host`: its network namespace) and listen on its
        address instead of loopback; call before `start()`."""
        self.host, self.address = host, host.address
        return self

    # --- what a subclass says -----------------------------------------------------------------
    @property
    def url(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        """True once the server answers (may raise while it does not)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """What must exist before the process starts (runs before every start)."""

    def after_start(self) -> None:
        """What to do once the server answers (runs after every start)."""

    def popen_options(self) -> dict[str, Any]:
        return {}

    def launch_command(self) -> list[str]:
        """`command()`, run on the server's host when it has one."""
        return self.command() if self.host is None else self.host.wrap(self.command())

    # --- the life cycle -------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the server (no-op while it runs) and wait until it serves. A process killed by
        a signal before it served is started again: a child forked from a busy multi-threaded
        parent (gRPC threads) has been seen to die of SIGSEGV before its exec."""
        if self.is_running():
            return
        self.prepare()
        for attempt in range(1, self.start_attempts + 1):
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("ab") as out:
                self.proc = subprocess.Popen(
                    self.launch_command(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True, **self.popen_options())
            try:
                _wait_until(self.ready, self.name, self.log, self.proc, self.start_timeout_s)
                break
            except ServerStartError:
                died_of_signal = self.proc.poll() is not None and self.proc.returncode < 0
                self.stop("kill")
                if not died_of_signal or attempt == self.start_attempts:
                    raise
        self.after_start()

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server: "fast" shuts it down cleanly, "kill" is a crash (SIGKILL to every
        process of it at once); PostgreSQL also knows "smart" and "immediate". Waits until none of its
        processes is left, so `start()` can take the port and data again."""
        if mode not in self.stop_signals:
            raise ValueError(f"{self.name} stops with one of {sorted(self.stop_signals)}, not {mode!r}")
        if self.proc is None:
            return
        stop_process(self.proc, self.stop_signals[mode], self.stop_grace_s)
        self.proc = None

    def kill(self) -> None:
        """A crash: SIGKILL to the server and all its processes."""
        self.stop("kill")

    def restart(self, down_s: float = 0.0, mode: StopMode = "fast") -> None:
        """Stop (`mode`), stay away `down_s` seconds, start again on the same port and data."""
        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        """Stop (cleanly, else killed) and delete the directory if it was a temporary one."""
        try:
            self.stop("fast")
        finally:
            if self.proc is not None:
                self.stop("kill")
            if self.owns_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def rss_mb(self) -> float | None:
        """Resident memory of the server's main process."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except (OSError, TypeError):
            return None
        return None



# --- Redis ------------------------------------------------------------------------------------------

# The broker's durability and memory policy, as in production (see the module docstring).
REDIS_BROKER_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec",
                     "--maxmemory-policy", "noeviction", "--save", "")
REDIS_NO_PERSISTENCE_ARGS = ("--appendonly", "no", "--save", "")


class LocalRedis(LocalServer):
    """A redis-server configured as the production broker (append-only file; `persistent=False`:
    nothing written to disk, a restart comes back empty). A write acknowledged before a crash is
    in the append-only file already (Redis writes it before it replies), so it survives
    `stop("kill")` too."""

    name = "redis"

    def __init__(self, workdir: Path | None = None, port: int | None = None, *,
                 persistent: bool = True, log: Path | None = None) -> None:
        super().__init__(workdir, port, log=log)
        self.persistent = persistent

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.port}/0"

    def command(self) -> list[str]:
        # protected mode refuses clients from other hosts when no password is set
        return [REDIS_SERVER, "--port", str(self.port), "--bind", self.address, "--protected-mode",
                "yes" if self.host is None else "no", "--dir", str(self.workdir),
                *(REDIS_BROKER_ARGS if self.persistent else REDIS_NO_PERSISTENCE_ARGS), "--daemonize", "no"]

    def ready(self) -> bool:
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()


@contextmanager
def local_redis_server(persistent: bool = True) -> Iterator[LocalRedis]:
    """A started `LocalRedis` in a fresh directory, stopped and deleted on exit."""
    with LocalRedis(persistent=persistent) as server:
        yield server


@contextmanager
def local_redis() -> Iterator[str]:
    """A redis-server on a free loopback port; yields `redis://127.0.0.1:PORT/0`."""
    with local_redis_server() as server:
        yield server.url


# --- PostgreSQL ---------------------------------------------------------------------------------------


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


def _as_user(user: pwd.struct_passwd | None) -> dict[str, Any]:
    """Popen options that run a child as `user` (nothing for None)."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"


def _run_as(user: pwd.struct_passwd | None, args: Sequence[str], log: Path, attempts: int = 3) -> None:
    """Run a PostgreSQL program to its end as `user`, its output appended to `log`. A child killed
    by a signal (see `LocalServer.start`) is run again.

    The switch to `user` is `setpriv`'s, not Popen's `user=`: with it Python forks (no vfork), and
    a child forked from a process whose gRPC threads are busy (a campaign's load client) was seen
    to die of SIGSEGV before its exec three times in a row (`pg_ctl promote`, exit -11)."""
    command = list(args) if user is None or not Path(SETPRIV).exists() else [
        SETPRIV, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--", *args]
    options = _as_user(user) if command[0] != SETPRIV else {}
    for attempt in range(1, attempts + 1):
        with log.open("ab") as out:
            proc = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "LC_ALL": "C.UTF-8"}, cwd="/", timeout=120, **options,
            )
        if proc.returncode == 0:
            return
        if proc.returncode > 0 or attempt == attempts:
            raise ServerStartError(f"{' '.join(args[:2])} failed ({proc.returncode}):\n{tail_of(log)}")


class LocalPostgres(LocalServer):
    """A PostgreSQL cluster (initdb once, then the `postgres` server as a child) with trust
    authentication on loopback and the database `database`. Under root the cluster belongs to
    and runs as the `postgres` (or `nobody`) account: a given `workdir` must be reachable by it.

    Stop modes are PostgreSQL's shutdown modes (`smart`, `fast`, `immediate`: SIGTERM, SIGINT,
    SIGQUIT to the postmaster; immediate skips the checkpoint, so the next start recovers from
    the WAL) and `kill` (SIGKILL to every process of the server: a crash).
    """

    name = "postgres"
    stop_signals = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT,
                    "kill": signal.SIGKILL}
    stop_grace_s = 60.0

    def __init__(self, workdir: Path | None = None, port: int | None = None, *, database: str = "arag",
                 durability: Durability = "off", max_connections: int = 200, log: Path | None = None) -> None:
        if durability not in DURABILITY_OPTIONS:
            raise ValueError(f"durability is one of {sorted(DURABILITY_OPTIONS)}, not {durability!r}")
        super().__init__(workdir, port, log=log)
        self.database = database
        self.durability = durability
        self.max_connections = max_connections
        self.user = _pg_user()
        self.data = self.workdir / "data"
        self.sockets = self.workdir / "sock"

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of `database` (psycopg 3)."""
        return f"postgresql+psycopg://arag@{self.address}:{self.port}/{self.database}"

    @property
    def admin_url(self) -> str:
        """A libpq URL of the `postgres` maintenance database."""
        return f"postgresql://arag@{self.address}:{self.port}/postgres"

    def prepare_directories(self) -> None:
        """The socket folder and the log, owned by the server's account when it runs as one."""
        self.sockets.mkdir(exist_ok=True)
        self.log.touch()
        if self.user is not None:
            for path in (self.workdir, self.sockets):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def prepare(self) -> None:
        self.prepare_directories()
        if not (self.data / "PG_VERSION").exists():
            _run_as(self.user, [str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "arag", "--auth=trust",
                                "--no-sync", "-E", "UTF8"], self.log)
        self.allow_host_clients()

    def allow_host_clients(self) -> None:
        """On a host, trust the clients of its own subnet too (initdb trusts loopback only)."""
        hba = self.data / "pg_hba.conf"
        # (replication: a streaming replica on a host copies and follows this server)
        lines = ("host all all samenet trust", "host replication all samenet trust")
        if self.host is not None and hba.exists() and lines[1] not in hba.read_text():
            with hba.open("a") as out:
                out.write("\n# the harness's hosts (infra.local.hosts)\n" + "\n".join(lines) + "\n")

    def command(self) -> list[str]:
        options = [f"listen_addresses={self.address}", f"max_connections={self.max_connections}",
                   *DURABILITY_OPTIONS[self.durability]]
        return [str(PG_BIN / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.sockets),
                *(arg for option in options for arg in ("-c", option))]

    def popen_options(self) -> dict[str, Any]:
        # on a host, `launch_command` changes user after the namespace switch (which needs root)
        user = _as_user(self.user) if self.host is None else {}
        return {**user, "env": {**os.environ, "LC_ALL": "C.UTF-8"}, "cwd": "/"}

    def launch_command(self) -> list[str]:
        if self.host is None:
            return self.command()
        return self.host.wrap(self.command(), user=None if self.user is None else (self.user.pw_uid, self.user.pw_gid))

    def ready(self) -> bool:
        import psycopg

        psycopg.connect(self.admin_url, connect_timeout=1).close()
        return True

    def after_start(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{self.database}"')


@contextmanager
def local_postgres(database: str = "arag", *, durability: Durability = "off") -> Iterator[str]:
    """A PostgreSQL on a free loopback port in a fresh directory, deleted on exit; yields
    `postgresql+psycopg://arag@127.0.0.1:PORT/<database>`."""
    with LocalPostgres(database=database, durability=durability) as server:
        yield server.url
