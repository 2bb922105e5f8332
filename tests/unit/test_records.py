"""RecordStore on SQLite through the real Alembic migrations.

The same tests run on a real PostgreSQL in `tests/integration/test_records_postgres.py` (they
only use the `store` fixture), so both dialects keep one behaviour.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import create_engine, inspect

from adaptive_rag.contracts import (
    AnswerResult, ErrorCode, RequestStatus, ResultKind, RoutingDecision, Source, Tier, Timings,
)
from adaptive_rag.errors import DatabaseUnavailableError, DuplicateRequestError, RequestNotFoundError
from adaptive_rag.storage import KnowledgeRecords, RecordStore, make_engine, upgrade_database
from adaptive_rag.storage.records import hash_key

SOURCES = (Source(id="kb-1", title="Pairing a bulb", score=3.5),)
TIMINGS = Timings(queue_wait_ms=4.0, strategy_ms=900.0, retrieve_ms=3.0, generate_ms=890.0)


@pytest.fixture
def store(tmp_path) -> RecordStore:
    url = f"sqlite:///{tmp_path}/db/arag.db"
    upgrade_database(url)
    return RecordStore(make_engine(url))


def new_request(store: RecordStore, tenant: str = "acme", client_id: str | None = None) -> str:
    request_id = uuid.uuid4().hex
    store.create_request(request_id, tenant, client_id, "How do I pair a Lumora bulb?")
    return request_id


def save(store: RecordStore, request_id: str, answer: str | None = "Hold the button.",
         worker: str = "tier-b@host", attempts: int = 1, **kw) -> bool:
    fields = dict(request_id=request_id, kind="primary", tier="B", strategy="single_step",
                  answer=answer, steps=1, sources=SOURCES, timings=TIMINGS)
    fields.update(kw)
    return store.save_result(AnswerResult(**fields), worker, attempts)


def test_a_database_that_does_not_answer_is_the_librarys_unavailable_error(tmp_path):
    """No SQLAlchemy exception leaves the store: a database it cannot reach (here a SQLite file in
    a directory that does not exist) is `DatabaseUnavailableError`, for every call."""
    engine = create_engine(f"sqlite:///{tmp_path}/missing/arag.db")
    unreachable = RecordStore(engine)
    calls = (unreachable.ping, lambda: unreachable.principal_for_key("arag_x"),
             lambda: new_request(unreachable), lambda: unreachable.readmit("r1"),
             lambda: KnowledgeRecords(engine).state("acme"))
    for call in calls:
        with pytest.raises(DatabaseUnavailableError,
                           match=r"^the records database is unreachable \(OperationalError\)$"):
            call()


def test_migrations_create_every_serving_table(store):
    tables = set(inspect(store.engine).get_table_names())
    assert {"api_keys", "requests", "routing_decisions", "results", "feedback",
            "training_labels"} <= tables


def test_models_match_the_migrations(store):
    """Alembic autogenerate finds nothing to add: the models and the revisions agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from adaptive_rag.storage import Base

    with store.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_api_key_is_returned_once_and_stored_hashed(store):
    key = store.create_api_key("acme")
    assert key.startswith("arag_") and len(key) > 30
    assert store.tenant_for_key(key) == "acme"
    assert store.tenant_for_key(key + "x") is None
    assert store.tenant_for_key("") is None
    [listed] = store.list_api_keys()
    assert (listed.tenant, listed.key_prefix, listed.revoked_at) == ("acme", key[:8], None)
    with store.engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT key_hash FROM api_keys").scalar_one()
    assert stored == hash_key(key) and key not in stored


def test_revoked_key_no_longer_authenticates(store):
    key = store.create_api_key("acme")
    other = store.create_api_key("globex")
    [first, _] = store.list_api_keys()
    assert store.revoke_api_key(first.id)
    assert not store.revoke_api_key(first.id)
    assert store.tenant_for_key(key) is None
    assert store.tenant_for_key(other) == "globex"


def test_the_key_tables_revision_changes_with_every_revocation_and_new_key(store):
    empty = store.api_keys_revision()
    store.create_api_key("acme")
    created = store.api_keys_revision()
    store.create_api_key("globex")
    assert len({empty, created, store.api_keys_revision()}) == 3
    before = store.api_keys_revision()
    assert store.revoke_api_key(store.list_api_keys()[0].id)
    revoked = store.api_keys_revision()
    assert revoked != before and store.api_keys_revision() == revoked  # a read changes nothing


def test_create_find_and_get_request(store):
    request_id = uuid.uuid4().hex
    created = store.create_request(request_id, "acme", "client-1", "What is Lumora?")
    assert created.status == "queued"
    found = store.find_request("acme", "client-1")
    assert found is not None and found.request_id == request_id and found.query == "What is Lumora?"
    assert store.get_request(request_id) == found
    assert store.find_request("globex", "client-1") is None
    assert store.get_request("nope") is None


def test_repeated_client_request_id_is_a_duplicate_per_tenant(store):
    new_request(store, "acme", "client-1")
    with pytest.raises(DuplicateRequestError):
        new_request(store, "acme", "client-1")
    new_request(store, "globex", "client-1")  # another tenant may use the same id
    new_request(store, "acme", None)  # requests without a client id never collide
    new_request(store, "acme", None)


def test_a_duplicate_request_writes_nothing_not_even_its_decision(store):
    """The insert is the idempotency check: a resent client_request_id leaves no trace."""
    decision = RoutingDecision(tier=Tier.C, probabilities={"A": 0.1, "B": 0.2, "C": 0.7},
                               model_name="m", model_version=3, strategy="decompose", classify_ms=1.5)
    store.create_request("r-first", "acme", "client-9", "q", decision=decision)
    with pytest.raises(DuplicateRequestError):
        store.create_request("r-second", "acme", "client-9", "q", decision=decision)
    assert store.get_request("r-second") is None and store.decision_for("r-second") is None
    assert store.decision_for("r-first") == decision
    assert store.find_request("acme", "client-9").request_id == "r-first"


def test_a_request_answered_at_admission_is_recorded_finished_with_its_decision_and_result_at_once(store):
    decision = RoutingDecision(tier=Tier.A, model_name="small_talk", reason="small talk (thanks)",
                               strategy="small_talk", classify_ms=0.4)
    result = AnswerResult(request_id="r-thanks", tier=Tier.A, strategy="small_talk",
                          answer="You're welcome!", steps=0, timings=Timings(strategy_ms=0.1))
    store.record_answered("r-thanks", "acme", "client-1", "thanks!", decision, result, "frontdoor")
    view = store.get_request("r-thanks")
    assert (view.status, view.runs, view.deliveries) == (RequestStatus.DONE, 1, 1)
    assert view.conversation_id == "r-thanks" and store.decision_for("r-thanks") == decision
    stored = store.stored_result("r-thanks")
    assert (stored.result, stored.worker, stored.attempts) == (result, "frontdoor", 1)
    assert store.publish_unpublished(lambda task: pytest.fail(f"relayed {task}"), 0.0) == []
    assert not save(store, "r-thanks", "again", tier="A", strategy="small_talk")  # a late worker: no second row
    again = result.model_copy(update={"request_id": "r-other"})
    with pytest.raises(DuplicateRequestError):  # a resend is a replay: nothing more is written
        store.record_answered("r-other", "acme", "client-1", "thanks!", decision, again, "frontdoor")
    assert store.get_request("r-other") is None and store.get_result("r-other") is None
    assert store.decision_for("r-other") is None


def test_concurrent_creates_with_one_client_id_record_one_request(store):
    """Two front-door replicas racing on one idempotency key: one wins, the other is told."""
    barrier = threading.Barrier(4)

    def create(_: int) -> str:
        barrier.wait()
        try:
            new_request(store, "acme", "race")
            return "created"
        except DuplicateRequestError:
            return "duplicate"

    with ThreadPoolExecutor(4) as pool:
        outcomes = sorted(pool.map(create, range(4)))
    assert outcomes == ["created", "duplicate", "duplicate", "duplicate"]


def test_routing_decision_round_trip(store):
    request_id = new_request(store)
    recorded = RoutingDecision(
        tier=Tier.C, probabilities={"A": 0.1, "B": 0.2, "C": 0.7}, model_name="complexity",
        model_version=2, reason="classifier", strategy="decompose", classify_ms=3.5,
    )
    store.record_decision(request_id, recorded)
    assert store.decision_for(request_id) == recorded  # the same type back, field for field
    rules = RoutingDecision(tier=Tier.C, fallback=True, reason="rules", strategy="decompose")
    with pytest.raises(DuplicateRequestError):
        store.record_decision(request_id, rules)
    with pytest.raises(RequestNotFoundError):
        store.record_decision("missing", rules)


def test_fallback_decision_has_no_probabilities(store):
    request_id = new_request(store)
    store.record_decision(request_id, RoutingDecision(tier=Tier.B, fallback=True, reason="triton down",
                                                      strategy="single_step", classify_ms=0.2))
    decision = store.decision_for(request_id)
    assert decision.probabilities is None and decision.fallback and decision.model_version is None
    assert decision.model_name == "rules"
    assert store.decision_for("missing") is None


def test_save_result_writes_once_first_write_wins(store):
    request_id = new_request(store)
    assert save(store, request_id, "first")
    assert not save(store, request_id, "second")
    result = store.get_result(request_id)
    assert result == AnswerResult(request_id=request_id, tier=Tier.B, strategy="single_step",
                                  answer="first", steps=1, sources=SOURCES, timings=TIMINGS)
    assert result.ok
    assert store.get_request(request_id).status is RequestStatus.DONE
    assert store.count_results(request_id) == 1


def test_concurrent_saves_of_one_task_write_one_row(store):
    request_id = new_request(store)
    barrier = threading.Barrier(4)

    def write(i: int) -> bool:
        barrier.wait()
        return save(store, request_id, f"answer {i}")

    with ThreadPoolExecutor(4) as pool:
        written = list(pool.map(write, range(4)))
    assert written.count(True) == 1
    assert store.count_results(request_id) == 1


def test_error_result_marks_the_request_failed(store):
    request_id = new_request(store)
    assert save(store, request_id, None, error="index missing",
                error_code=ErrorCode.DEPENDENCY_UNAVAILABLE, attempts=3)
    stored = store.stored_result(request_id)
    assert not stored.result.ok and stored.result.error_code is ErrorCode.DEPENDENCY_UNAVAILABLE
    assert stored.attempts == 3 and stored.worker == "tier-b@host"
    assert store.get_request(request_id).status is RequestStatus.ERROR


def test_shadow_results_do_not_finish_the_request(store):
    request_id = new_request(store)
    store.set_status(request_id, "running")
    assert save(store, request_id, "shadow C", kind="shadow", tier="C", strategy="decompose")
    assert save(store, request_id, "shadow A", kind="shadow", tier="A", strategy="no_retrieval")
    assert not save(store, request_id, "again", kind="shadow", tier="A", strategy="no_retrieval")
    assert store.get_request(request_id).status == "running"
    assert store.get_result(request_id) is None
    assert [r.result.tier for r in store.shadow_results(request_id)] == ["C", "A"]
    assert store.get_result(request_id, ResultKind.SHADOW, Tier.A).answer == "shadow A"
    assert save(store, request_id, "primary")
    assert store.get_result(request_id).answer == "primary"
    assert store.count_results(request_id) == 3


def test_result_for_unknown_request_is_refused(store):
    with pytest.raises(RequestNotFoundError):
        save(store, "missing")
    with pytest.raises(ValueError):
        save(store, new_request(store), kind="other")  # not a ResultKind: refused by the type


def test_status_never_goes_back_from_a_final_state(store):
    request_id = new_request(store)
    store.set_status(request_id, "running")
    assert store.get_request(request_id).status == "running"
    save(store, request_id)
    store.set_status(request_id, "running")  # a redelivered task starting late
    store.set_status(request_id, "queued")
    assert store.get_request(request_id).status == "done"
    other = new_request(store)
    store.set_status(other, "rejected")
    assert store.get_request(other).status == "rejected"
    store.set_status(other, "running")  # nothing runs a rejected request ...
    assert store.get_request(other).status == "rejected"
    store.set_status(other, "queued")  # ... until the front door re-admits it
    assert store.get_request(other).status == "queued"
    with pytest.raises(ValueError):
        store.set_status(other, "lost")
    with pytest.raises(RequestNotFoundError):
        store.set_status("missing", "running")


def test_feedback_only_for_the_tenants_own_request(store):
    request_id = new_request(store, "acme")
    first = store.add_feedback(request_id, "acme", -1, "Hold for 5 s", "too vague")
    second = store.add_feedback(request_id, "acme", 1, None, None)
    assert second > first
    with pytest.raises(RequestNotFoundError):
        store.add_feedback(request_id, "globex", 1, None, None)
    with pytest.raises(RequestNotFoundError):
        store.add_feedback("missing", "acme", 1, None, None)
    with pytest.raises(ValueError):
        store.add_feedback(request_id, "acme", 2, None, None)
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT rating, correct_answer, comment FROM feedback ORDER BY id"
        ).all()
    assert [tuple(r) for r in rows] == [(-1, "Hold for 5 s", "too vague"), (1, None, None)]


def test_timestamps_are_utc_aware(store):
    request_id = new_request(store)
    view = store.get_request(request_id)
    assert view.created_at.tzinfo is not None and view.updated_at >= view.created_at


def test_keys_cli_creates_lists_and_revokes(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from adaptive_rag.cli import app

    url = f"sqlite:///{tmp_path}/keys.db"
    monkeypatch.setenv("DATABASE_URL", url)
    runner = CliRunner()
    created = runner.invoke(app, ["keys", "create", "--tenant", "acme"])
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[0]
    assert RecordStore(make_engine(url)).tenant_for_key(key) == "acme"
    listed = runner.invoke(app, ["keys", "list"])
    assert "acme" in listed.stdout and key[:8] in listed.stdout and key not in listed.stdout
    assert runner.invoke(app, ["keys", "revoke", "1"]).exit_code == 0
    assert RecordStore(make_engine(url)).tenant_for_key(key) is None
    assert runner.invoke(app, ["keys", "revoke", "1"]).exit_code == 2


def test_a_request_and_its_decision_are_recorded_in_one_transaction(store):
    decision = RoutingDecision(tier=Tier.A, probabilities={"A": 0.9, "B": 0.05, "C": 0.05},
                               model_name="complexity", model_version=3, strategy="no_retrieval")
    store.create_request("req-1", "acme", "client-9", "hi", RequestStatus.QUEUED, decision)
    assert store.decision_for("req-1") == decision
    with pytest.raises(DuplicateRequestError):  # the same client id again: nothing half-written
        store.create_request("req-2", "acme", "client-9", "hi", RequestStatus.QUEUED, decision)
    assert store.get_request("req-2") is None and store.decision_for("req-2") is None
    store.create_request("req-3", "acme", None, "hi", RequestStatus.ROUTED, decision)
    assert store.get_request("req-3").status is RequestStatus.ROUTED


# --- the request lifecycle: deliveries, expiry, re-admission -----------------------------------------


def age(store: RecordStore, request_id: str, seconds: float) -> None:
    """Make the request look `seconds` older (its last change happened that long ago)."""
    from datetime import timedelta

    from sqlalchemy import update

    from adaptive_rag.storage import QueryRequest
    from adaptive_rag.storage.models import utcnow

    with store.engine.begin() as conn:
        conn.execute(update(QueryRequest).where(QueryRequest.request_id == request_id)
                     .values(updated_at=utcnow() - timedelta(seconds=seconds)))


def test_begin_run_counts_deliveries_and_starts_only_a_request_in_flight(store):
    request_id = new_request(store)
    assert store.begin_run(request_id) == 1
    assert store.get_request(request_id).status is RequestStatus.RUNNING
    assert store.begin_run(request_id) == 2  # the worker died; the message came back
    assert store.get_request(request_id).deliveries == 2
    assert store.begin_run(request_id, ResultKind.SHADOW) == 1  # counted apart, status untouched
    assert store.get_request(request_id).runs == 2  # primary runs only
    assert store.get_request(request_id).status is RequestStatus.RUNNING
    save(store, request_id)
    assert store.begin_run(request_id) is None  # finished: nothing begins again
    assert store.get_request(request_id).status is RequestStatus.DONE
    never = new_request(store)
    store.set_status(never, RequestStatus.REJECTED)
    assert store.begin_run(never) is None
    assert store.get_request(never).status is RequestStatus.REJECTED
    assert (store.get_request(never).deliveries, store.get_request(never).runs) == (0, 0)
    with pytest.raises(RequestNotFoundError):
        store.begin_run("missing")


def test_a_run_is_counted_only_on_the_tasks_own_tenants_request(store):
    """A worker names its task's tenant: a request id of another tenant is unknown to it, and
    neither its status nor its counts move."""
    theirs = new_request(store, tenant="globex")
    with pytest.raises(RequestNotFoundError, match="for tenant 'acme'"):
        store.begin_run(theirs, tenant="acme")
    with pytest.raises(RequestNotFoundError):
        store.begin_run(theirs, ResultKind.SHADOW, tenant="acme")
    view = store.get_request(theirs)
    assert (view.status, view.deliveries, view.runs) == (RequestStatus.QUEUED, 0, 0)
    assert store.begin_run(theirs, tenant="globex") == 1
    assert store.get_request(theirs).runs == 1
    store.set_status(theirs, RequestStatus.DONE)
    assert store.begin_run(theirs, tenant="globex") is None  # its own, not in flight: no error


def test_runs_begun_at_once_are_each_counted(store):
    """Deliveries of one message racing (a redelivery while the first run still goes on) each
    count a run: the increment is one conditional statement, not a read and a write."""
    request_id = new_request(store)
    barrier = threading.Barrier(4)

    def begin() -> int | None:
        barrier.wait()
        return store.begin_run(request_id, tenant="acme")

    with ThreadPoolExecutor(4) as pool:
        counts = sorted(pool.map(lambda _: begin(), range(4)))
    assert counts == [1, 2, 3, 4]
    view = store.get_request(request_id)
    assert (view.deliveries, view.runs) == (4, 4)


def test_only_requests_queued_past_the_age_expire(store):
    old, fresh, running, done, rejected = (new_request(store) for _ in range(5))
    store.begin_run(running)
    save(store, done)
    store.set_status(rejected, RequestStatus.REJECTED)
    for request_id in (old, running, done, rejected):
        age(store, request_id, 120)
    assert store.expire_queued(60) == [old]
    status = {r: store.get_request(r).status for r in (old, fresh, running, done, rejected)}
    assert status == {old: "expired", fresh: "queued", running: "running", done: "done", rejected: "rejected"}
    assert store.expire_queued(60) == []  # already expired
    assert store.begin_run(old) is None  # a worker reaching its message does not run it


def test_a_worker_and_the_sweep_on_one_request_never_both_win(store):
    """The expiry is conditional on `queued`: whichever of the two commits first decides."""
    for _ in range(10):
        request_id = new_request(store)
        age(store, request_id, 5)
        barrier = threading.Barrier(2)

        def begin() -> int | None:
            barrier.wait()
            return store.begin_run(request_id)

        def sweep() -> list[str] | None:
            barrier.wait()
            return store.expire_queued(1)

        with ThreadPoolExecutor(2) as pool:
            began, swept = pool.submit(begin), pool.submit(sweep)
            began, swept = began.result(), swept.result()
        if began is not None:
            assert request_id not in swept and store.get_request(request_id).status == "running"
        else:
            assert request_id in swept and store.get_request(request_id).status == "expired"


def test_readmit_queues_again_what_never_ran_and_what_a_dependency_failed(store):
    expired = new_request(store)
    age(store, expired, 120)
    store.expire_queued(60)
    rejected = new_request(store)
    store.set_status(rejected, RequestStatus.REJECTED)
    for request_id in (expired, rejected):
        assert store.readmit(request_id)
        view = store.get_request(request_id)
        assert view.status is RequestStatus.QUEUED and view.updated_at > view.created_at
    assert store.expire_queued(60) == []  # re-admitted now: its age starts again

    failed = new_request(store)
    store.begin_run(failed)
    store.begin_run(failed)
    save(store, failed, "shadow", kind="shadow", tier="C", strategy="decompose")
    save(store, failed, None, error="LLMUnavailableError: refused", error_code=ErrorCode.DEPENDENCY_UNAVAILABLE)
    assert store.readmit(failed)
    view = store.get_request(failed)
    assert (view.status, view.deliveries) == (RequestStatus.QUEUED, 0)  # counted afresh
    assert store.get_result(failed) is None  # the failed run's row is gone, the shadow run's kept
    assert store.get_result(failed, ResultKind.SHADOW, Tier.C).answer == "shadow"
    assert store.begin_run(failed) == 1
    assert store.get_request(failed).runs == 3  # every run the request began, the new one too
    assert save(store, failed, "answered this time")  # the one primary row of the request
    assert store.get_result(failed).answer == "answered this time"
    assert store.count_results(failed) == 2 and not store.readmit(failed)


@pytest.mark.parametrize("code", [ErrorCode.TIME_LIMIT, ErrorCode.INTERNAL])
def test_other_errors_and_requests_in_flight_are_not_readmitted(store, code):
    final = new_request(store)
    save(store, final, None, error="it failed", error_code=code)
    assert not store.readmit(final)
    assert store.get_request(final).status is RequestStatus.ERROR
    assert store.get_result(final).error_code is code
    queued, running = new_request(store), new_request(store)
    store.begin_run(running)
    assert not store.readmit(queued) and not store.readmit(running)
    assert store.get_request(running).deliveries == 1


def test_two_front_doors_readmitting_one_request_queue_it_once(store):
    for _ in range(5):
        request_id = new_request(store)
        save(store, request_id, None, error="down", error_code=ErrorCode.DEPENDENCY_UNAVAILABLE)
        barrier = threading.Barrier(3)

        def readmit(_: int) -> bool:
            barrier.wait()
            return store.readmit(request_id)

        with ThreadPoolExecutor(3) as pool:
            outcomes = list(pool.map(readmit, range(3)))
        assert outcomes.count(True) == 1
        assert store.get_request(request_id).status is RequestStatus.QUEUED
        assert store.count_results(request_id) == 0


# --- the outbox: a request whose task was never published ------------------------------------------

def routed_request(store: RecordStore, tier: Tier = Tier.B, age_s: float = 0.0) -> str:
    """A request recorded with its decision, as an admission writes it before the enqueue, last
    changed `age_s` ago."""
    request_id = uuid.uuid4().hex
    store.create_request(request_id, "acme", None, "How do I pair a Lumora bulb?", decision=RoutingDecision(
        tier=tier, fallback=True, reason="test", strategy="single_step"))
    if age_s:
        age(store, request_id, age_s)
    return request_id


def test_a_request_never_marked_published_is_published_again_once_old_enough_then_never_again(store):
    request_id = routed_request(store, Tier.C)
    sent = []
    assert store.publish_unpublished(sent.append, 30.0) == []  # its own admission may publish it yet
    age(store, request_id, 60.0)
    assert store.publish_unpublished(sent.append, 30.0) == [request_id]
    [task] = sent
    assert (task.request_id, task.tenant, task.tier, task.strategy, task.kind) == (
        request_id, "acme", Tier.C, "single_step", ResultKind.PRIMARY)
    assert task.query == "How do I pair a Lumora bulb?" and task.enqueued_at > 0
    view = store.get_request(request_id)
    assert view.status is RequestStatus.QUEUED and view.updated_at > view.created_at  # a new age
    age(store, request_id, 60.0)
    assert store.publish_unpublished(sent.append, 30.0) == [] and len(sent) == 1  # marked


def test_a_marked_or_no_longer_queued_request_is_left_alone_until_it_is_readmitted(store):
    marked, running, rejected, done = (routed_request(store) for _ in range(4))
    store.mark_enqueued(marked)
    store.mark_enqueued(marked)  # a second mark changes nothing
    assert store.begin_run(running) == 1
    store.set_status(rejected, RequestStatus.REJECTED)
    assert save(store, done)
    for request_id in (marked, running, rejected, done):
        age(store, request_id, 60.0)
    stranded = routed_request(store, age_s=60.0)
    sent = []
    assert store.publish_unpublished(sent.append, 30.0) == [stranded]
    assert store.publish_unpublished(sent.append, 0.0, rejected) == []
    assert store.readmit(rejected)  # its client resent it: queued again, its publish not yet marked
    assert store.publish_unpublished(sent.append, 0.0, rejected) == [rejected]
    assert [t.request_id for t in sent] == [stranded, rejected]


def test_a_publish_that_fails_marks_the_ones_before_it_and_leaves_the_rest_for_the_next_pass(store):
    first, second, third = (routed_request(store, age_s=age) for age in (300.0, 200.0, 100.0))
    sent = []

    def broker_goes_away(task) -> None:
        if len(sent) == 1:
            raise DatabaseUnavailableError("the task queue is unreachable")  # any error of the broker
        sent.append(task.request_id)

    with pytest.raises(DatabaseUnavailableError):
        store.publish_unpublished(broker_goes_away, 30.0)
    assert sent == [first]
    again = []
    assert store.publish_unpublished(lambda task: again.append(task.request_id), 30.0) == [second, third]
    assert again == [second, third]


def test_one_pass_publishes_at_most_its_batch_oldest_first(store):
    ids = [routed_request(store, age_s=100.0 + n) for n in range(3)]
    assert store.publish_unpublished(lambda task: None, 30.0, limit=2) == [ids[2], ids[1]]
    assert store.publish_unpublished(lambda task: None, 30.0, limit=2) == [ids[0]]


def published_ago(store: RecordStore, request_id: str, seconds: float) -> None:
    """Mark the request's task published `seconds` ago."""
    from datetime import timedelta

    from sqlalchemy import update

    from adaptive_rag.storage import QueryRequest
    from adaptive_rag.storage.models import utcnow

    with store.engine.begin() as conn:
        conn.execute(update(QueryRequest).where(QueryRequest.request_id == request_id)
                     .values(enqueued_at=utcnow() - timedelta(seconds=seconds)))


def test_undelivered_lists_published_requests_no_worker_began_oldest_first(store):
    waiting, older, fresh, begun, unpublished, expired = (routed_request(store) for _ in range(6))
    for request_id, seconds in ((waiting, 20.0), (older, 40.0), (fresh, 2.0), (begun, 40.0), (expired, 40.0)):
        published_ago(store, request_id, seconds)
    assert store.begin_run(begun) == 1
    store.set_status(expired, RequestStatus.EXPIRED)
    assert store.undelivered(10.0) == [older, waiting]
    assert store.undelivered(10.0, limit=1) == [older]


def test_a_lost_message_is_published_once_and_only_while_still_undelivered(store):
    lost, begun, young = (routed_request(store, Tier.C) for _ in range(3))
    for request_id in (lost, begun):
        published_ago(store, request_id, 30.0)
    published_ago(store, young, 1.0)
    assert store.begin_run(begun) == 1  # a worker began it after the check looked: not lost
    sent = []
    assert store.publish_lost(sent.append, [lost, begun, young], 10.0) == [lost]
    [task] = sent
    assert (task.request_id, task.tier, task.strategy) == (lost, Tier.C, "single_step")
    # marked published now: another replica that found the same loss publishes nothing
    assert store.publish_lost(sent.append, [lost], 10.0) == [] and len(sent) == 1
    assert store.undelivered(10.0) == [] and store.get_request(lost).status is RequestStatus.QUEUED
    assert store.publish_lost(sent.append, [], 10.0) == []


# --- conversations -------------------------------------------------------------------------------


def turn(store: RecordStore, query: str, conversation_id: str | None = None, tenant: str = "acme",
         standalone: str | None = None, answer: str | None = None) -> str:
    request_id = uuid.uuid4().hex
    view = store.create_request(request_id, tenant, None, query, conversation_id=conversation_id,
                                standalone_query=standalone, rewrite="rules" if standalone else None)
    assert view.conversation_id == (conversation_id or request_id)
    if answer is not None:
        save(store, request_id, answer=answer)
    return request_id


def test_a_conversations_turns_come_back_oldest_first_as_searched_with_their_answers(store):
    from datetime import UTC, datetime, timedelta

    first = turn(store, "What is a novel coronavirus?", answer="A new coronavirus [1].")
    second = turn(store, "how does it spread?", first, standalone="How does a novel coronavirus spread?")
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    turns = store.conversation_turns("acme", first, long_ago, 10)
    assert [(t.request_id, t.question, t.answer) for t in turns] == [
        (first, "What is a novel coronavirus?", "A new coronavirus [1]."),
        (second, "How does a novel coronavirus spread?", ""),  # still running: no answer yet
    ]
    assert [t.request_id for t in store.conversation_turns("acme", first, long_ago, 1)] == [second]
    view = store.get_request(second)
    assert (view.query, view.standalone_query, view.rewrite, view.conversation_id) == (
        "how does it spread?", "How does a novel coronavirus spread?", "rules", first)
    assert view.searched_query == "How does a novel coronavirus spread?"


def test_a_conversation_is_its_tenants_only_and_counts_within_the_retention(store):
    from datetime import UTC, datetime, timedelta

    first = turn(store, "What is a novel coronavirus?")
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    assert store.conversation_turns("globex", first, long_ago, 10) is None
    assert store.conversation_turns("acme", "f" * 32, long_ago, 10) is None
    assert store.conversation_turns("acme", first, datetime.now(UTC) + timedelta(seconds=5), 10) is None


def test_a_relayed_follow_up_runs_on_its_standalone_question(store):
    request_id = uuid.uuid4().hex
    first = turn(store, "What is a novel coronavirus?")
    store.create_request(request_id, "acme", None, "how does it spread?", decision=RoutingDecision(
        tier=Tier.B, fallback=True, reason="test", strategy="single_step"), conversation_id=first,
        standalone_query="How does a novel coronavirus spread?", rewrite="rules")
    age(store, request_id, 60.0)
    sent = []
    assert store.publish_unpublished(sent.append, 30.0) == [request_id]
    assert sent[0].query == "How does a novel coronavirus spread?"
