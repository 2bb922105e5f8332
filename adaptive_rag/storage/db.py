"""Engines, sessions and migrations for the URL in `DATABASE_URL` (SQLite file by default)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

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
