"""The RecordStore suite of `tests/unit/test_records.py` on a real PostgreSQL, through the same
Alembic migrations; plus the migration chain down and up again on PostgreSQL."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from adaptive_rag.errors import DatabaseUnavailableError
from adaptive_rag.storage import RecordStore, make_engine, upgrade_database
from adaptive_rag.storage.db import alembic_config

pytestmark = pytest.mark.integration

_spec = importlib.util.spec_from_file_location(
    "records_suite", Path(__file__).resolve().parents[1] / "unit" / "test_records.py"
)
records_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(records_suite)
# Every `test_*` of the SQLite suite, collected here against the `store` fixture below.
globals().update(
    {name: getattr(records_suite, name) for name in dir(records_suite) if name.startswith("test_")}
)

SERVING_TABLES = ("feedback", "results", "routing_decisions", "requests", "api_keys")


@pytest.fixture(scope="module")
def migrated_engine(postgres_url: str):
    upgrade_database(postgres_url)
    engine = make_engine(postgres_url)
    yield engine
    engine.dispose()


@pytest.fixture
def store(migrated_engine) -> Iterator[RecordStore]:
    """An empty set of serving tables for every test (the suite counts rows)."""
    with migrated_engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(SERVING_TABLES)} RESTART IDENTITY CASCADE"))
    yield RecordStore(migrated_engine)


def test_keys_cli_creates_lists_and_revokes(postgres_url, monkeypatch, migrated_engine):
    with migrated_engine.begin() as conn:
        conn.execute(text("TRUNCATE api_keys RESTART IDENTITY CASCADE"))
    from typer.testing import CliRunner

    from adaptive_rag.cli import app

    monkeypatch.setenv("DATABASE_URL", postgres_url)
    runner = CliRunner()
    created = runner.invoke(app, ["keys", "create", "--tenant", "acme"])
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[0]
    assert RecordStore(migrated_engine).tenant_for_key(key) == "acme"


def test_postgres_uses_jsonb_and_the_named_constraints(migrated_engine):
    inspector = inspect(migrated_engine)
    results = {c["name"]: c for c in inspector.get_columns("results")}
    assert type(results["sources"]["type"]).__name__ == "JSONB"
    uniques = {u["name"] for u in inspector.get_unique_constraints("results")}
    assert "uq_results_request_kind_tier" in uniques
    requests_uniques = {u["name"] for u in inspector.get_unique_constraints("requests")}
    assert "uq_requests_tenant_client_id" in requests_uniques


def test_migrations_downgrade_and_upgrade_again(postgres_url, migrated_engine):
    from alembic import command

    config = alembic_config(postgres_url)
    command.downgrade(config, "0001_training_labels")
    assert "results" not in inspect(migrated_engine).get_table_names()
    assert "training_labels" in inspect(migrated_engine).get_table_names()
    command.upgrade(config, "head")
    assert set(SERVING_TABLES) <= set(inspect(migrated_engine).get_table_names())


def test_the_runs_column_starts_from_the_deliveries_known_before_it(store, postgres_url, migrated_engine):
    """`0010_request_runs` on PostgreSQL: a row written before it counts the runs still known
    (its `deliveries`), a new row starts at 0, and the downgrade drops the column."""
    from alembic import command

    config = alembic_config(postgres_url)
    command.downgrade(config, "0009_kb_abstention")
    try:
        assert "runs" not in {c["name"] for c in inspect(migrated_engine).get_columns("requests")}
        with migrated_engine.begin() as conn:
            conn.execute(text("INSERT INTO requests (request_id, tenant, query, status, deliveries) "
                              "VALUES ('old', 'acme', 'q', 'done', 3), ('older', 'acme', 'q', 'queued', 0)"))
    finally:
        command.upgrade(config, "head")
    assert (store.get_request("old").runs, store.get_request("older").runs) == (3, 0)
    assert store.begin_run("older", tenant="acme") == 1
    assert store.get_request("older").runs == 1


def test_one_process_sweeps_the_queued_requests_at_a_time(store):
    """A second front door finds the sweep's advisory lock held and skips its turn."""
    from adaptive_rag.storage.locks import advisory_lock
    from adaptive_rag.storage.records import EXPIRY_SWEEP_LOCK, SweepBusyError

    request_id = records_suite.new_request(store)
    records_suite.age(store, request_id, 120)
    with advisory_lock(store.engine, EXPIRY_SWEEP_LOCK, SweepBusyError):
        assert store.expire_queued(60) is None
        assert store.get_request(request_id).status == "queued"
    assert store.expire_queued(60) == [request_id]
    assert store.get_request(request_id).status == "expired"


def test_relays_of_several_front_doors_take_disjoint_rows_and_skip_locked_ones(store):
    """The relay's claim is `FOR UPDATE SKIP LOCKED`: a row another relay holds is skipped, not
    waited for, and is still there for the next pass; relays at once publish each row once."""
    import threading
    import time

    from sqlalchemy import select

    from adaptive_rag.storage import QueryRequest

    held = records_suite.routed_request(store, age_s=120)
    with store.engine.begin() as conn:  # another relay holds it (and dies: its claim rolls back)
        conn.execute(select(QueryRequest).where(QueryRequest.request_id == held).with_for_update())
        started = time.monotonic()
        assert store.publish_unpublished(lambda task: None, 60) == []
        assert time.monotonic() - started < 2.0
    assert store.publish_unpublished(lambda task: None, 60) == [held]

    stranded = {records_suite.routed_request(store, age_s=120) for _ in range(6)}
    sent: list[str] = []

    def slow_broker(task) -> None:  # every relay is mid-publish while the others claim
        time.sleep(0.1)
        sent.append(task.request_id)

    relays = [threading.Thread(target=store.publish_unpublished, args=(slow_broker, 60)) for _ in range(3)]
    for relay in relays:
        relay.start()
    for relay in relays:
        relay.join(30)
    assert sorted(sent) == sorted(stranded)  # each row published once
    assert store.publish_unpublished(slow_broker, 0) == []


def test_the_per_answer_writes_are_one_statement_each_without_a_transaction(store):
    """What an Answer costs the records on PostgreSQL: the request with its decision (also the
    idempotency check), the run's claim and its result are one statement each, in autocommit (no
    BEGIN / COMMIT round trips); a resent client_request_id writes nothing."""
    from sqlalchemy import event

    from adaptive_rag.contracts import AnswerResult, RoutingDecision, Tier
    from adaptive_rag.errors import DuplicateRequestError

    sent: list[str] = []
    engine = store.engine

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        autocommit = conn.connection.dbapi_connection.autocommit
        sent.append(statement.split(None, 1)[0].upper() + (" (autocommit)" if autocommit else ""))

    event.listen(engine, "before_cursor_execute", count)
    try:
        decision = RoutingDecision(tier=Tier.B, probabilities={"A": 0.1, "B": 0.8, "C": 0.1},
                                   model_name="m", model_version=2, strategy="single_step")
        store.create_request("r-1", "acme", "c-1", "q", decision=decision)
        assert sent == ["WITH (autocommit)"]
        with pytest.raises(DuplicateRequestError):
            store.create_request("r-2", "acme", "c-1", "q", decision=decision)
        assert store.begin_run("r-1") == 1
        sent.clear()
        result = AnswerResult(request_id="r-1", tier=Tier.B, strategy="single_step", answer="x")
        assert store.save_result(result, "w", 1) and not store.save_result(result, "w", 2)
        assert sent == ["WITH (autocommit)", "WITH (autocommit)"]
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert store.decision_for("r-1") == decision and store.decision_for("r-2") is None
    assert store.get_request("r-1").status.value == "done"
    assert store.stored_result("r-1").attempts == 1


def test_a_server_that_drops_the_connection_is_unavailable_once_then_the_store_recovers(postgres_url, migrated_engine):
    """The store's error mapping leaves SQLAlchemy's disconnect handling as it was: the broken
    connection is dropped from the pool, and the next call gets a fresh one."""
    engine, killer = make_engine(postgres_url), make_engine(postgres_url)
    try:
        store = RecordStore(engine)
        with engine.connect() as conn:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        with killer.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
        with pytest.raises(DatabaseUnavailableError, match="records database is unreachable"):
            store.get_request("r-none")  # the pooled connection was in steady use: it fails once
        assert store.get_request("r-none") is None
    finally:
        engine.dispose()
        killer.dispose()


def test_a_server_that_is_not_there_is_unavailable():
    store = RecordStore(make_engine("postgresql+psycopg://arag@127.0.0.1:1/arag?connect_timeout=2"))
    with pytest.raises(DatabaseUnavailableError, match=r"unreachable \(OperationalError\)"):
        store.ping()
