"""Pooled PostgreSQL connections the server closed: an idle one is pinged and replaced before use;
one in steady use fails its call once, and the next call gets a fresh connection."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError

from adaptive_rag.storage.db import make_engine, normalise_url, ping_when_idle


def backend_pid(engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()


@contextmanager
def engine_pinging_after(postgres_url: str, idle_s: float) -> Iterator:
    engine = create_engine(normalise_url(postgres_url))
    ping_when_idle(engine, idle_s=idle_s)
    try:
        yield engine
    finally:
        engine.dispose()


def terminate(postgres_url: str, pid: int) -> None:
    """What a database restart or an idle timeout does to a pooled connection."""
    with psycopg.connect(postgres_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]


def test_make_engine_pings_only_connections_left_idle(postgres_url):
    engine = make_engine(postgres_url)
    try:
        assert not engine.pool._pre_ping  # no round trip per checkout
        first = backend_pid(engine)
        assert backend_pid(engine) == first  # the pooled connection is reused
    finally:
        engine.dispose()


def test_an_idle_connection_the_server_closed_is_replaced_before_use(postgres_url):
    with engine_pinging_after(postgres_url, idle_s=0.05) as engine:
        closed = backend_pid(engine)
        terminate(postgres_url, closed)
        time.sleep(0.1)
        assert backend_pid(engine) != closed  # the ping failed, the pool opened another one


def test_a_connection_closed_while_in_steady_use_fails_once_then_the_pool_recovers(postgres_url):
    with engine_pinging_after(postgres_url, idle_s=60.0) as engine:
        closed = backend_pid(engine)
        terminate(postgres_url, closed)
        with pytest.raises(DBAPIError) as failed:
            backend_pid(engine)
        assert failed.value.connection_invalidated
        assert backend_pid(engine) != closed
