"""Engines, sessions and migrations for the URL in `DATABASE_URL` (SQLite file by default), and
the one place the driver's "the database does not answer" becomes the library's own error."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from adaptive_rag.errors import DatabaseUnavailableError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
# A pooled server connection that sat unused this long is pinged before it is handed out.
PING_AFTER_IDLE_S = 1.0


def normalise_url(url: str) -> str:
    """`postgresql://` and `postgres://` mean psycopg 3 (`postgresql+psycopg://`)."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def make_engine(url: str) -> Engine:
    """An engine for `url`; a SQLite file's directory is created, foreign keys are enforced."""
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    engine = create_engine(url)
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
