"""Tier queues end to end with real parts: redis-server (broker + result backend), PostgreSQL
(records), real `celery worker` processes started by `workers.pools`, the real tantivy index of
the demo knowledge base and the real embedded LLM (Gemma 3 270M, one thread per worker).

Each scenario that needs its own broker state uses its own Redis database number, so a pool
started for one test never consumes another test's messages.

Run: `.venv/bin/pytest -q tests/integration/test_workers.py`
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptive_rag.evaluation.corpus import read_jsonl_corpus
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from adaptive_rag.settings import Settings
from adaptive_rag.storage import RecordStore, make_engine, upgrade_database
from workers.celery_app import create_app
from workers.dispatch import QUEUE_FOR_TIER, enqueue, queue_depth, result_for, wait_result
from workers.pools import WorkerPools

pytestmark = [pytest.mark.integration, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
KB = REPO / "demo" / "knowledge_base.jsonl"
QUESTIONS = {
    "A": ("What is the capital of France?", "no_retrieval"),
    "B": ("How do I factory reset a Lumora bulb?", "single_step"),
    "C": ("Which hub status light shows after factory resetting the hub?", "decompose"),
}
# Generous: two shared cores, another LLM job running beside the tests.
WAIT_S = 300.0


def redis_db(url: str, db: int) -> str:
    return f"{url.rsplit('/', 1)[0]}/{db}"


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("workers-index") / "index"
    TantivyRetriever.build(path, read_jsonl_corpus(KB))
    return path


@pytest.fixture(scope="module")
def store(postgres_url: str) -> RecordStore:
    upgrade_database(postgres_url)
    return RecordStore(make_engine(postgres_url))


@pytest.fixture(scope="module")
def make_settings(redis_url, postgres_url, demo_index):
    def make(db: int, **overrides) -> Settings:
        values = dict(
            redis_url=redis_db(redis_url, db), database_url=postgres_url, index_dir=demo_index,
            llm_threads=1, top_k=2, max_passages=3, max_steps=2, multi_step="decompose",
            concurrency_a=1, concurrency_b=1, concurrency_c=1, concurrency_shadow=1,
            task_max_retries=2, task_retry_backoff_s=0.2,
        )
        values.update(overrides)
        return Settings(_env_file=None, **values)

    return make


@pytest.fixture(scope="module")
def settings(make_settings) -> Settings:
    return make_settings(0)


@pytest.fixture(scope="module")
def pools(settings, tmp_path_factory) -> Iterator[WorkerPools]:
    with WorkerPools(settings, pools=("A", "B", "C", "shadow"),
                     log_dir=tmp_path_factory.mktemp("worker-logs")) as running:
        yield running


@pytest.fixture(scope="module")
def app(settings):
    return create_app(settings)


def submit(store: RecordStore, app, tier: str, query: str | None = None,
           strategy: str | None = None):
    """What the front door does: record the request and its routing, then enqueue."""
    default_query, default_strategy = QUESTIONS[tier]
    query, strategy = query or default_query, strategy or default_strategy
    request_id = uuid.uuid4().hex
    store.create_request(request_id, "acme", None, query)
    store.record_decision(request_id, tier, strategy, None, None, None, True, "test", 0.0)
    return request_id, enqueue(request_id, query, tier, strategy, app=app)


def wait_for_status(store: RecordStore, request_id: str, status: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.get_request(request_id).status == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"request {request_id} never reached {status!r}")


def test_each_tier_is_answered_by_its_own_pool(pools, store, app):
    sent = {tier: submit(store, app, tier) for tier in ("A", "B", "C")}
    kb_ids = {p.id for p in read_jsonl_corpus(KB)}
    for tier, (request_id, handle) in sent.items():
        payload = wait_result(handle, WAIT_S)
        assert payload["error"] is None and payload["error_code"] is None, payload
        assert (payload["request_id"], payload["tier"], payload["kind"]) == (request_id, tier, "primary")
        assert payload["strategy"] == QUESTIONS[tier][1]
        assert isinstance(payload["answer"], str)
        assert set(payload["timings"]) == {"queue_wait_ms", "strategy_ms", "retrieve_ms", "generate_ms"}
        assert payload["timings"]["strategy_ms"] > 0 and payload["timings"]["queue_wait_ms"] >= 0
        if tier == "A":
            assert payload["steps"] == 0 and payload["sources"] == []
        else:
            assert payload["steps"] >= 1 and payload["sources"]
            assert {s["id"] for s in payload["sources"]} <= kb_ids
        row = store.get_result(request_id)
        assert row is not None and row.answer == payload["answer"] and row.attempts == 1
        assert row.worker.startswith(f"{QUEUE_FOR_TIER[tier]}@")  # served by the tier's own pool
        assert store.get_request(request_id).status == "done"
        assert store.count_results(request_id) == 1
    # Nothing left behind in any queue.
    assert all(queue_depth(q, app=app) == 0 for q in ("tier-a", "tier-b", "tier-c"))


def test_a_task_delivered_twice_writes_one_row(pools, store, app):
    request_id, first = submit(store, app, "A")
    second = enqueue(request_id, QUESTIONS["A"][0], "A", "no_retrieval", app=app)  # same task id
    assert second.id == first.id == request_id
    answers = [wait_result(first, WAIT_S)]
    log = pools.pools["A"].log_path
    deadline = time.monotonic() + WAIT_S
    while f"request_id={request_id}" not in _already_done_lines(log) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"request_id={request_id}" in _already_done_lines(log), "second delivery never ran"
    answers.append(wait_result(result_for(request_id, app=app), 10))
    assert answers[0] == answers[1]
    assert store.count_results(request_id) == 1


def _already_done_lines(log: Path) -> str:
    return "\n".join(line for line in log.read_text(errors="replace").splitlines()
                     if "task.already_done" in line)


def test_worker_process_killed_mid_c_task_is_requeued_and_answered_once(pools, store, app):
    """SIGKILL the prefork child running a C task: the pool notices the lost process and sends the
    task again to `tier-c` (retry_on_worker_lost; reject_on_worker_lost requeues it should that
    send fail); a fresh child runs it and the first message is acknowledged only then."""
    request_id, handle = submit(store, app, "C")
    wait_for_status(store, request_id, "running")
    [child] = pools.pools["C"].child_pids()
    assert store.count_results(request_id) == 0  # killed before any answer existed
    os.kill(child, signal.SIGKILL)
    payload = wait_result(handle, WAIT_S)
    assert payload["error"] is None, payload
    assert store.count_results(request_id) == 1
    row = store.get_result(request_id)
    assert row.answer == payload["answer"]
    assert not row.worker.endswith(f"/{child}")  # answered by another process...
    assert row.worker.startswith("tier-c@")  # ...of the same pool: sent again to tier-c
    assert row.attempts == 2
    assert f"pid:{child} exited with 'signal 9 (SIGKILL)'" in pools.pools["C"].log_path.read_text()


def test_whole_worker_killed_mid_c_task_is_redelivered_after_visibility_timeout(
    make_settings, store, tmp_path
):
    """The whole C worker dies (solo pool, SIGKILL): nobody rejects the message, Redis keeps it
    as unacknowledged, and a fresh worker restores it once the visibility timeout passed."""
    visibility = 15.0
    settings = make_settings(2, visibility_timeout_s=visibility)
    app = create_app(settings)
    with WorkerPools(settings, pools=("C",), pool_impl="solo", log_dir=tmp_path) as pools:
        request_id, handle = submit(store, app, "C")
        wait_for_status(store, request_id, "running")
        assert store.count_results(request_id) == 0
        pools.kill("C")
        killed_at = time.monotonic()
        assert queue_depth("tier-c", app=app) == 0  # not back in the queue: only unacked
        pools.start_pool("C")
        payload = wait_result(handle, WAIT_S)
        assert payload["error"] is None, payload
        assert time.monotonic() - killed_at >= visibility * 0.9
    assert store.count_results(request_id) == 1
    assert store.get_result(request_id).answer == payload["answer"]


def test_a_strategy_that_keeps_failing_ends_as_a_recorded_error(make_settings, store, tmp_path):
    """A B pool whose index directory does not exist: retried with backoff, then recorded."""
    settings = make_settings(1, index_dir=tmp_path / "no-such-index")
    app = create_app(settings)
    with WorkerPools(settings, pools=("B",), log_dir=tmp_path):
        request_id, handle = submit(store, app, "B")
        payload = wait_result(handle, WAIT_S)
    assert payload["error_code"] == "UNAVAILABLE" and payload["answer"] is None
    assert "IndexNotFoundError" in payload["error"]
    row = store.get_result(request_id)
    assert row is not None and row.error_code == "UNAVAILABLE"
    assert row.attempts == settings.task_max_retries + 1
    assert store.get_request(request_id).status == "error"
    assert store.count_results(request_id) == 1


def test_queue_depth_counts_waiting_messages_on_redis(make_settings, store):
    app = create_app(make_settings(3))  # a database no worker consumes from
    for _ in range(2):
        submit(store, app, "C")
    submit(store, app, "A")
    assert [queue_depth(q, app=app) for q in ("tier-a", "tier-b", "tier-c", "shadow")] == [1, 0, 2, 0]


def test_embedded_defaults_need_no_server(make_settings, tmp_path):
    """No REDIS_URL: filesystem broker and file result backend under ARAG_BROKER_DIR, SQLite."""
    database_url = f"sqlite:///{tmp_path}/arag.db"
    settings = make_settings(0, redis_url=None, broker_dir=tmp_path / "broker",
                             database_url=database_url)
    app = create_app(settings)
    assert app.conf.broker_url == "filesystem://"
    upgrade_database(database_url)
    store = RecordStore(make_engine(database_url))
    waiting, _ = submit(store, app, "C")  # no C pool here: it stays queued
    assert queue_depth("tier-c", app=app) == 1 and queue_depth("tier-a", app=app) == 0
    with WorkerPools(settings, pools=("A",), log_dir=tmp_path):
        request_id, handle = submit(store, app, "A")
        payload = wait_result(handle, WAIT_S)
    assert payload["error"] is None and payload["tier"] == "A"
    assert store.get_result(request_id).answer == payload["answer"]
    assert store.get_request(waiting).status == "queued"
    assert queue_depth("tier-c", app=app) == 1


def test_shadow_run_goes_to_the_shadow_pool_and_leaves_the_primary_alone(pools, store, app):
    request_id, primary = submit(store, app, "A")
    shadow = enqueue(request_id, QUESTIONS["A"][0], "B", "single_step", kind="shadow", app=app)
    assert shadow.id != primary.id
    shadow_payload = wait_result(shadow, WAIT_S)
    primary_payload = wait_result(primary, WAIT_S)
    assert (shadow_payload["kind"], shadow_payload["tier"]) == ("shadow", "B")
    assert primary_payload["kind"] == "primary" and primary_payload["tier"] == "A"
    [row] = store.shadow_results(request_id)
    assert row.worker.startswith("shadow@") and row.strategy == "single_step"
    assert store.get_result(request_id).tier == "A"
    assert store.count_results(request_id) == 2


def test_soft_time_limit_ends_as_a_recorded_deadline_error(pools, store, make_settings):
    """Time limits travel with the message (per tier, from the sender's settings)."""
    hurried = create_app(make_settings(0, time_limit_c_s=1.0))
    request_id, handle = submit(store, hurried, "C")
    payload = wait_result(handle, WAIT_S)
    assert payload["error_code"] == "DEADLINE_EXCEEDED", payload
    row = store.get_result(request_id)
    assert row.error_code == "DEADLINE_EXCEEDED" and row.answer is None
    assert store.get_request(request_id).status == "error"


def test_a_task_that_keeps_killing_its_worker_ends_as_a_recorded_error(make_settings, store, tmp_path):
    """With no retries left, a lost pool process is not retried again: the worker's main process
    records the error result (a poison message must not crash pools forever)."""
    settings = make_settings(4, task_max_retries=0)
    app = create_app(settings)
    with WorkerPools(settings, pools=("C",), log_dir=tmp_path) as pools:
        request_id, handle = submit(store, app, "C")
        wait_for_status(store, request_id, "running")
        [child] = pools.pools["C"].child_pids()
        os.kill(child, signal.SIGKILL)
        payload = wait_result(handle, WAIT_S)
        assert payload["error_code"] == "INTERNAL" and "WorkerLostError" in payload["error"]
        deadline = time.monotonic() + 30
        while store.get_result(request_id) is None and time.monotonic() < deadline:
            time.sleep(0.1)
    row = store.get_result(request_id)
    assert row is not None and row.error_code == "INTERNAL" and "WorkerLostError" in row.error
    assert row.worker.startswith("tier-c@")
    assert store.get_request(request_id).status == "error"
    assert store.count_results(request_id) == 1
