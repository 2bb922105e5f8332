"""Tier queues end to end with real parts: redis-server (broker + result backend), PostgreSQL
(records), real `celery worker` processes started by `workers.pools`, the real tantivy index of
the demo knowledge base and the real embedded LLM (Gemma 3 270M, one thread per worker).

Each scenario that needs its own broker state uses its own Redis database number, so a pool
started for one test never consumes another test's messages.

Run: `.venv/bin/pytest -q tests/integration/test_workers.py`
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from adaptive_rag.contracts import (
    QUEUE_FOR_TIER, AnswerResult, AnswerTask, ErrorCode, RequestStatus, ResultKind, RoutingDecision,
    Tier,
)
from adaptive_rag.evaluation.corpus import read_jsonl_corpus
from adaptive_rag.knowledge.importers import import_path
from adaptive_rag.knowledge.service import open_knowledge_service
from adaptive_rag.settings import Settings
from adaptive_rag.storage import RecordStore, make_engine, upgrade_database
from workers.celery_app import create_app
from workers.client import CeleryTaskQueue, open_result_waiter
from workers.pools import WorkerPools
from workers.settings import WorkerSettings
from tests.support.redis import redis_db

pytestmark = [pytest.mark.integration, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
KB = REPO / "demo" / "knowledge_base.jsonl"
TENANT = "acme"
QUESTIONS = {
    "A": ("What is the capital of France?", "no_retrieval"),
    "B": ("How do I factory reset a Lumora bulb?", "single_step"),
    "C": ("Which hub status light shows after factory resetting the hub?", "decompose"),
}
# Generous: two shared cores, another LLM job running beside the tests.
WAIT_S = 300.0


@pytest.fixture(scope="module")
def kb_dir(tmp_path_factory, postgres_url) -> Path:
    """Tenant acme's knowledge base (the demo help centre) under a fresh ARAG_KB_DIR."""
    path = tmp_path_factory.mktemp("workers-kb")
    upgrade_database(postgres_url)
    library = Settings(_env_file=None, kb_dir=path, database_url=postgres_url)
    open_knowledge_service(library, make_engine(postgres_url)).upsert(TENANT, import_path(KB))
    return path


@dataclass(frozen=True)
class Setup:
    """What the worker processes read: the library's settings and the workers' own."""

    library: Settings
    workers: WorkerSettings

    def pools(self, names, **kwargs) -> WorkerPools:
        return WorkerPools(self.workers, pools=names, library=self.library, **kwargs)


@pytest.fixture(scope="module")
def make_settings(redis_url, postgres_url, kb_dir):
    def make(db: int, library: dict | None = None, **workers) -> Setup:
        library_values = dict(database_url=postgres_url, kb_dir=kb_dir, llm_threads=1,
                              top_k=2, max_passages=3, max_steps=2, multi_step="decompose")
        library_values.update(library or {})
        worker_values = dict(redis_url=redis_db(redis_url, db), task_max_retries=2,
                             task_retry_backoff_s=0.2,
                             concurrency={"A": 1, "B": 1, "C": 1, "shadow": 1})
        worker_values.update(workers)
        return Setup(Settings(_env_file=None, **library_values),
                     WorkerSettings(_env_file=None, **worker_values))

    return make


@pytest.fixture(scope="module")
def settings(make_settings) -> Setup:
    return make_settings(0)


@pytest.fixture(scope="module")
def pools(settings, tmp_path_factory) -> Iterator[WorkerPools]:
    with settings.pools(("A", "B", "C", "shadow"), log_dir=tmp_path_factory.mktemp("worker-logs")) as running:
        yield running


@pytest.fixture(scope="module")
def app(settings):
    return create_app(settings.workers)


def send(app, request_id: str, tier: str, query: str | None = None, strategy: str | None = None,
         kind: ResultKind = ResultKind.PRIMARY, tenant: str = "acme") -> AnswerTask:
    default_query, default_strategy = QUESTIONS[tier]
    task = AnswerTask(request_id=request_id, tenant=tenant, query=query or default_query, tier=tier,
                      strategy=strategy or default_strategy, kind=kind, enqueued_at=time.time())
    CeleryTaskQueue(app).enqueue(task)
    return task


def submit(store: RecordStore, app, tier: str, query: str | None = None,
           strategy: str | None = None) -> tuple[str, AnswerTask]:
    """What the front door does: record the request and its routing, then enqueue."""
    query = query or QUESTIONS[tier][0]
    strategy = strategy or QUESTIONS[tier][1]
    request_id = uuid.uuid4().hex
    store.create_request(request_id, "acme", None, query)
    store.record_decision(request_id, RoutingDecision(tier=tier, fallback=True, reason="test",
                                                      strategy=strategy))
    return request_id, send(app, request_id, tier, query, strategy)


def wait_result(app, task: AnswerTask, timeout: float) -> AnswerResult:
    """Wait for the task's result as the front door does (Redis pub/sub, or threads)."""

    async def wait() -> AnswerResult:
        waiter = open_result_waiter(app, threads=1)
        await waiter.start()
        try:
            return await waiter.wait(task.task_id, timeout)
        finally:
            await waiter.close()

    return asyncio.run(wait())


def queue_depth(queue: str, app) -> int:
    return CeleryTaskQueue(app).depth(queue)


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
    for tier, (request_id, task) in sent.items():
        result = wait_result(app, task, WAIT_S)
        assert result.ok and result.error is None, result
        assert (result.request_id, result.tier, result.kind) == (request_id, tier, ResultKind.PRIMARY)
        assert result.strategy == QUESTIONS[tier][1]
        assert isinstance(result.answer, str)
        assert result.timings.strategy_ms > 0 and result.timings.queue_wait_ms >= 0
        if tier == "A":
            assert result.steps == 0 and result.sources == ()
        else:
            assert result.steps >= 1 and result.sources
            assert {s.id.split("#")[0] for s in result.sources} <= kb_ids  # chunks of acme's documents
        stored = store.stored_result(request_id)
        assert stored is not None and stored.result == result and stored.attempts == 1
        assert stored.worker.startswith(f"{QUEUE_FOR_TIER[Tier(tier)]}@")  # the tier's own pool
        assert store.get_request(request_id).status is RequestStatus.DONE
        assert store.count_results(request_id) == 1
    # Nothing left behind in any queue.
    assert all(queue_depth(q, app=app) == 0 for q in ("tier-a", "tier-b", "tier-c"))


@pytest.mark.parametrize(("tier", "strategy"), [("B", "self_route"), ("A", "uncertainty")])
def test_a_self_routing_strategy_runs_whole_on_its_entry_tiers_pool(pools, store, app, tier, strategy):
    """`ARAG_ROUTER=self-route | uncertainty`: the task names the strategy; the entry tier's pool
    runs it, escalation included (more steps, and passages for an escalated draft)."""
    request_id, task = submit(store, app, tier, query=QUESTIONS["B"][0], strategy=strategy)
    result = wait_result(app, task, WAIT_S)
    assert result.ok and (result.tier, result.strategy) == (tier, strategy), result
    stored = store.stored_result(request_id)
    assert stored.worker.startswith(f"{QUEUE_FOR_TIER[Tier(tier)]}@") and stored.attempts == 1
    escalated = result.steps > (0 if tier == "A" else 1)
    assert bool(result.sources) == (tier == "B" or escalated)  # A's draft alone retrieves nothing
    assert store.get_request(request_id).status is RequestStatus.DONE


def test_a_task_delivered_twice_writes_one_row(pools, store, app):
    request_id, first = submit(store, app, "A")
    second = send(app, request_id, "A")  # the same task id
    assert second.task_id == first.task_id == request_id
    answers = [wait_result(app, first, WAIT_S)]
    log = pools.pools["A"].log_path
    deadline = time.monotonic() + WAIT_S
    while request_id not in _already_done(log) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert request_id in _already_done(log), "second delivery never ran"
    answers.append(wait_result(app, second, 10))
    assert answers[0] == answers[1]
    assert store.count_results(request_id) == 1


def _already_done(log: Path) -> set[str]:
    """Request ids of the worker's `task.already_done` events (its log lines are JSON)."""
    found = set()
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and "task.already_done" in line:
            event = json.loads(line)
            if event.get("event") == "task.already_done":
                found.add(event["request_id"])
    return found


def test_worker_process_killed_mid_c_task_is_requeued_and_answered_once(pools, store, app):
    """SIGKILL the prefork child running a C task: the pool notices the lost process and sends the
    task again to `tier-c` (retry_on_worker_lost; reject_on_worker_lost requeues it should that
    send fail); a fresh child runs it and the first message is acknowledged only then."""
    request_id, handle = submit(store, app, "C")
    wait_for_status(store, request_id, RequestStatus.RUNNING)
    [child] = pools.pools["C"].child_pids()
    assert store.count_results(request_id) == 0  # killed before any answer existed
    os.kill(child, signal.SIGKILL)
    result = wait_result(app, handle, WAIT_S)
    assert result.ok, result
    assert store.count_results(request_id) == 1
    row = store.stored_result(request_id)
    assert row.result.answer == result.answer
    assert not row.worker.endswith(f"/{child}")  # answered by another process...
    assert row.worker.startswith("tier-c@")  # ...of the same pool: sent again to tier-c
    assert row.attempts == 2
    assert f"pid:{child} exited with 'signal 9 (SIGKILL)'" in pools.pools["C"].log_path.read_text()


def test_whole_worker_killed_mid_c_task_is_redelivered_once_its_consumer_lease_runs_out(
    make_settings, store, tmp_path
):
    """The whole C worker dies (solo pool, SIGKILL): nobody rejects the message, Redis keeps it
    as reserved by that worker's consumer, and a fresh worker puts it back on its queue once the
    dead consumer's lease ran out, long before the (default, 15-minute) visibility timeout."""
    lease = 4.0
    settings = make_settings(2, consumer_lease_s=lease)
    assert settings.workers.visibility_timeout_s == 900.0
    app = create_app(settings.workers)
    with settings.pools(("C",), pool_impl="solo", log_dir=tmp_path) as pools:
        request_id, handle = submit(store, app, "C")
        wait_for_status(store, request_id, RequestStatus.RUNNING)
        assert store.count_results(request_id) == 0
        pools.kill("C")
        killed_at = time.monotonic()
        assert queue_depth("tier-c", app=app) == 0  # not back in the queue: only reserved
        pools.start_pool("C")
        result = wait_result(app, handle, WAIT_S)
        assert result.ok, result
        took = time.monotonic() - killed_at  # the restart included: 10-20 s on a loaded machine
        assert lease * 0.9 <= took <= 120.0, took  # far from the visibility timeout
        assert "lease ran out" in pools.pools["C"].log_path.read_text()
    assert store.count_results(request_id) == 1
    assert store.get_result(request_id) == result


def test_a_strategy_that_keeps_failing_ends_as_a_recorded_error(make_settings, store, tmp_path):
    """A B pool whose knowledge bases are not there: retried with backoff, then recorded."""
    settings = make_settings(1, library={"kb_dir": tmp_path / "no-such-kb"})
    app = create_app(settings.workers)
    with settings.pools(("B",), log_dir=tmp_path):
        request_id, handle = submit(store, app, "B")
        result = wait_result(app, handle, WAIT_S)
    assert result.error_code is ErrorCode.DEPENDENCY_UNAVAILABLE and result.answer is None
    assert "IndexNotFoundError" in result.error
    row = store.stored_result(request_id)
    assert row is not None and row.result == result
    assert row.attempts == settings.workers.task_max_retries + 1
    assert store.get_request(request_id).status is RequestStatus.ERROR
    assert store.count_results(request_id) == 1


def test_queue_depth_counts_waiting_messages_on_redis(make_settings, store):
    app = create_app(make_settings(3).workers)  # a database no worker consumes from
    for _ in range(2):
        submit(store, app, "C")
    submit(store, app, "A")
    assert [queue_depth(q, app=app) for q in ("tier-a", "tier-b", "tier-c", "shadow")] == [1, 0, 2, 0]


def test_queue_depth_is_one_pipelined_read_without_an_existence_check(make_settings):
    """The depth is read with LLENs alone (one pipelined round trip), not a passive declare's
    EXISTS first: a missing list is an empty queue."""
    import redis

    settings = make_settings(4).workers
    app = create_app(settings)
    client = redis.Redis.from_url(settings.redis_url)
    assert queue_depth("tier-b", app=app) == 0  # connects first
    client.config_resetstat()
    assert queue_depth("tier-b", app=app) == 0
    stats = client.info("commandstats")
    assert "cmdstat_exists" not in stats
    assert stats["cmdstat_llen"]["calls"] >= 1


def test_embedded_defaults_need_no_server(make_settings, tmp_path):
    """No REDIS_URL: filesystem broker and file result backend under ARAG_BROKER_DIR, SQLite."""
    database_url = f"sqlite:///{tmp_path}/arag.db"
    settings = make_settings(0, library={"database_url": database_url}, redis_url=None,
                             broker_dir=tmp_path / "broker")
    app = create_app(settings.workers)
    assert app.conf.broker_url == "filesystem://"
    upgrade_database(database_url)
    store = RecordStore(make_engine(database_url))
    waiting, _ = submit(store, app, "C")  # no C pool here: it stays queued
    assert queue_depth("tier-c", app=app) == 1 and queue_depth("tier-a", app=app) == 0
    with settings.pools(("A",), log_dir=tmp_path):
        request_id, handle = submit(store, app, "A")
        result = wait_result(app, handle, WAIT_S)
    assert result.ok and result.tier is Tier.A
    assert store.get_result(request_id) == result
    assert store.get_request(waiting).status is RequestStatus.QUEUED
    assert queue_depth("tier-c", app=app) == 1


def test_shadow_run_goes_to_the_shadow_pool_and_leaves_the_primary_alone(pools, store, app):
    request_id, primary = submit(store, app, "A")
    shadow = send(app, request_id, "B", QUESTIONS["A"][0], "single_step", kind=ResultKind.SHADOW)
    assert shadow.task_id != primary.task_id
    shadow_result = wait_result(app, shadow, WAIT_S)
    primary_result = wait_result(app, primary, WAIT_S)
    assert (shadow_result.kind, shadow_result.tier) == (ResultKind.SHADOW, Tier.B)
    assert primary_result.kind is ResultKind.PRIMARY and primary_result.tier is Tier.A
    [row] = store.shadow_results(request_id)
    assert row.worker.startswith("shadow@") and row.result.strategy == "single_step"
    assert store.get_result(request_id).tier is Tier.A
    assert store.count_results(request_id) == 2


def test_soft_time_limit_ends_as_a_recorded_deadline_error(pools, store, make_settings):
    """Time limits travel with the message (per tier, from the sender's settings)."""
    hurried = create_app(make_settings(0, time_limit_s={"C": 1.0}).workers)
    request_id, handle = submit(store, hurried, "C")
    result = wait_result(hurried, handle, WAIT_S)
    assert result.error_code is ErrorCode.TIME_LIMIT, result
    row = store.get_result(request_id)
    assert row == result and row.answer is None
    assert store.get_request(request_id).status is RequestStatus.ERROR


def test_a_task_that_keeps_killing_its_worker_ends_as_a_recorded_error(make_settings, store, tmp_path):
    """With no retries left, a lost pool process is not retried again: the worker's main process
    records the error result (a poison message must not crash pools forever)."""
    settings = make_settings(4, task_max_retries=0)
    app = create_app(settings.workers)
    with settings.pools(("C",), log_dir=tmp_path) as pools:
        request_id, handle = submit(store, app, "C")
        wait_for_status(store, request_id, RequestStatus.RUNNING)
        [child] = pools.pools["C"].child_pids()
        os.kill(child, signal.SIGKILL)
        result = wait_result(app, handle, WAIT_S)
        assert result.error_code is ErrorCode.INTERNAL and "WorkerLostError" in result.error
        deadline = time.monotonic() + 30
        while store.get_result(request_id) is None and time.monotonic() < deadline:
            time.sleep(0.1)
    row = store.stored_result(request_id)
    assert row is not None and row.result.error_code is ErrorCode.INTERNAL
    assert "WorkerLostError" in row.result.error
    assert row.worker.startswith("tier-c@")
    assert store.get_request(request_id).status is RequestStatus.ERROR
    assert store.count_results(request_id) == 1
