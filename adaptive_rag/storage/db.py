"""Engines, sessions and migrations for the URL in `DATABASE_URL` (SQLite file by default), and
the one place the driver's "the database does not answer" becomes the library's own error."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from adaptive_rag.errors import ConfigurationError, DatabaseUnavailableError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
# A pooled server connection that sat unused this long is pinged before it is handed out.
PING_AFTER_IDLE_S = 1.0
# With several hosts listed: seconds a connection attempt waits for one before trying the next.
MULTI_HOST_CONNECT_TIMEOUT_S = 5


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 (`postgresql+psycopg://`). A libpq
    multi-host URL (`postgresql://user@h1:5432,h2:5432/db?target_session_attrs=read-write`)
    becomes SQLAlchemy's form of it (`postgresql+psycopg://user@/db?host=h1:5432&host=h2:5432&...`),
    which the driver receives as libpq's `host=h1,h2 port=5432,5432`."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    if url.startswith("postgresql"):
        url = _multi_host_as_query(url)
    return url


def _multi_host_as_query(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if "," not in hosts:
        return url
    path, question, query = tail.partition("?")
    host_params = "&".join(f"host={quote(h, safe=':[]')}" for h in hosts.split(",") if h)
    query = f"{host_params}&{query}" if query else host_params
    return f"{scheme}{sep}{userinfo}{at}/{path}?{query}"


def database_hosts(url: str) -> list[tuple[str, int | None]]:
    """The (host, port) pairs a PostgreSQL URL lists, in the order the driver tries them."""
    parsed = make_url(normalise_url(url))
    listed = parsed.query.get("host")
    if listed:
        return [_host_port(item, parsed.port) for item in ((listed,) if isinstance(listed, str) else listed)]
    return [(parsed.host or "localhost", parsed.port)]


def _host_port(item: str, default: int | None) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]` or `[v6]:port`."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest.lstrip(":")
    elif item.count(":") == 1:
        host, port = item.split(":")
    else:
        host, port = item, ""
    return host, int(port) if port else default


# A host that accepts writes answers ("primary"); the others are a "standby" (in recovery) or
# "read-only" (default_transaction_read_only on), or raise when they do not answer.
HostProbe = Callable[[str, str, "int | None", float], str]
WRITABLE_ATTRS = ("read-write", "primary")


def probe_host(url: str, host: str, port: int | None, timeout_s: float) -> str:
    """What one host of `url` is: "primary", "standby" or "read-only"; raises when it does not
    answer within `timeout_s`."""
    parsed = make_url(normalise_url(url))
    query = {k: v for k, v in parsed.query.items() if k not in ("host", "target_session_attrs")}
    single = parsed.set(host=host, port=port, query=query)
    engine = create_engine(single, poolclass=NullPool, connect_args={"connect_timeout": max(1, round(timeout_s))})
    try:
        with engine.connect() as conn:
            recovery, read_only = conn.execute(
                text("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")).one()
    finally:
        engine.dispose()
    if recovery:
        return "standby"
    return "read-only" if read_only == "on" else "primary"


def check_writable(url: str, timeout_s: float = 3.0, probe: HostProbe = probe_host) -> str | None:
    """The start-up check of `DATABASE_URL`: a PostgreSQL URL whose hosts answer but none of
    which accepts writes (a list of replicas only), or that lists several hosts without
    `target_session_attrs=read-write` (a connection could land on a read-only standby), is a
    configuration error (`ConfigurationError`, naming each host and what it is). Returns what was
    found; None when there is nothing to check (SQLite) or no host answered at all (an outage:
    the services start and report it, as with one host)."""
    parsed = make_url(normalise_url(url))
    if parsed.get_backend_name() != "postgresql":
        return None
    hosts = database_hosts(url)
    attrs = parsed.query.get("target_session_attrs", "any")
    if len(hosts) > 1 and attrs not in WRITABLE_ATTRS:
        raise ConfigurationError(
            f"DATABASE_URL lists {len(hosts)} hosts ({_names(hosts)}) with target_session_attrs={attrs}: "
            "a connection may land on a read-only standby; add target_session_attrs=read-write")
    found: list[str] = []
    answered = False
    for host, port in hosts:
        try:
            role = probe(url, host, port, timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure to answer: say which, go on
            found.append(f"{_name(host, port)} does not answer ({type(exc).__name__})")
            continue
        answered = True
        if role == "primary":
            return f"primary {_name(host, port)}"
        found.append(f"{_name(host, port)} is a {role} (accepts no writes)")
    if not answered:
        return None
    raise ConfigurationError(
        f"DATABASE_URL: no host accepts writes: {'; '.join(found)}. List the primary (with "
        "target_session_attrs=read-write the driver picks it among the hosts)")


def _name(host: str, port: int | None) -> str:
    return f"{host}:{port}" if port else host


def _names(hosts: list[tuple[str, int | None]]) -> str:
    return ", ".join(_name(h, p) for h, p in hosts)


def make_engine(url: str) -> Engine:
    """An engine for `url`; a SQLite file's directory is created, foreign keys are enforced."""
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)

        on_disk = bool(parsed.database) and parsed.database != ":memory:"

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            if on_disk:
                # The embedded default is one file that the front door and every pool write:
                # write-ahead logging lets readers go on while one writes, and a commit is one
                # append to the log instead of a rewritten journal and its fsyncs (about 3x
                # fewer milliseconds per commit here). NORMAL keeps every commit through a
                # crash of any process; a power loss may lose the last ones.
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    connect_args = {}
    if len(database_hosts(url)) > 1 and "connect_timeout" not in parsed.query:
        # a host that is down (not refused) must not hold each connection attempt for the
        # operating system's TCP timeout before the next host is tried
        connect_args["connect_timeout"] = MULTI_HOST_CONNECT_TIMEOUT_S
    engine = create_engine(url, connect_args=connect_args)
    ping_when_idle(engine)
    return engine


def ping_when_idle(engine: Engine, idle_s: float = PING_AFTER_IDLE_S) -> None:
    """Ping a pooled connection before use only when it sat unused for `idle_s` or longer.

    SQLAlchemy's `pool_pre_ping` pings on every checkout: a round trip per records call, on the
    hot path of every Answer (the front door's insert, the worker's claim and result write). A
    connection in steady use was just seen working; one left idle is the one a database restart or
    an idle timeout has silently closed. A ping that fails makes the pool drop the connection and
    hand out a fresh one (SQLAlchemy's checkout-event recipe for pessimistic disconnect handling).
    A connection that breaks while in steady use fails its call once (the caller's error handling
    covers it: UNAVAILABLE at the front door, a retry in a worker), and the pool then replaces
    every connection opened before the failure.
    """

    @event.listens_for(engine, "checkin")
    def _note_idle(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.pop("idle_since", None)
        if idle_since is None or time.monotonic() - idle_since < idle_s:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # noqa: BLE001 - any failure: the pool replaces the connection
            raise DisconnectionError(f"idle connection failed its ping: {exc}") from exc


# The driver's errors that say the database does not answer (refused, lost, gone), as opposed to a
# statement it refused (`IntegrityError` and the like stay what they are).
UNREACHABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def map_database_errors(engine: Engine) -> None:
    """Make `engine` raise `DatabaseUnavailableError` wherever its driver says the database does
    not answer, for every statement and connection attempt (SQLAlchemy's `handle_error` hook, as
    httpx's `map_exceptions` does for its transports), so no caller above the storage adapters
    handles SQLAlchemy's exceptions. The pool's own handling (dropping a broken connection) runs
    as before. Idempotent: every adapter over the engine calls it."""
    if not event.contains(engine, "handle_error", _unavailable):
        event.listen(engine, "handle_error", _unavailable)


def _unavailable(context: ExceptionContext) -> DatabaseUnavailableError | None:
    if getattr(context, "is_pre_ping", False):  # SQLAlchemy's own pre-ping decides what to do
        return None
    if not (isinstance(context.sqlalchemy_exception, UNREACHABLE) or context.is_disconnect):
        return None
    # The driver's class name only: a status message must not carry hosts or credentials.
    return DatabaseUnavailableError(
        f"the records database is unreachable ({type(context.original_exception).__name__})")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str):
    """An Alembic `Config` for `url` that finds `migrations/` wherever the command runs."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return config


def upgrade_database(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations up to `revision` (creates the SQLite file if needed)."""
    from alembic import command

    make_engine(url).dispose()  # creates the SQLite directory
    command.upgrade(alembic_config(url), revision)
