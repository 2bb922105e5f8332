"""Queue configuration without any server: Celery settings from `WorkerSettings`, the worker pool
command lines, settings passed to worker processes, and the producer side on the filesystem
broker."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from adaptive_rag.contracts import AnswerTask, ResultKind, Tier, parse_task_id, task_id_for
from adaptive_rag.settings import Settings, as_environment
from workers.celery_app import QUEUES, broker_folders, celery_config, create_app
from workers.client import CeleryTaskQueue, ThreadedResultWaiter
from workers.pools import WorkerPools
from workers.settings import WorkerSettings


def task(request_id: str, tier: str, strategy: str, kind: ResultKind = ResultKind.PRIMARY) -> AnswerTask:
    return AnswerTask(request_id=request_id, tenant="acme", query="How do I pair a bulb?", tier=tier,
                      strategy=strategy, kind=kind, enqueued_at=time.time())


def test_redis_config_keeps_messages_until_the_task_finished():
    settings = WorkerSettings(_env_file=None, redis_url="redis://127.0.0.1:6399/0", visibility_timeout_s=40)
    config = celery_config(settings)
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]
    assert config["broker_url"] == "redis://127.0.0.1:6399/0"
    assert config["result_backend"] == "workers.redis_results:WriteOnceRedisBackend+redis://127.0.0.1:6399/0"
    options = config["broker_transport_options"]
    assert options["visibility_timeout"] == 40 and options["unacked_restore_interval"] <= 10
    assert [q.name for q in config["task_queues"]] == list(QUEUES) == [
        "tier-a", "tier-b", "tier-c", "shadow"]


def test_results_expire_from_redis_after_a_bounded_time_and_the_lease_reaches_the_transport():
    """The records keep every answer; Redis keeps results only for the waits (a day's worth grew
    Redis by 130 %/h in the soak). The consumer lease sets how soon a dead worker's messages
    are swept back (every half lease at most)."""
    default = celery_config(WorkerSettings(_env_file=None, redis_url="redis://127.0.0.1:6399/0"))
    assert default["result_expires"] == 900
    assert default["broker_transport_options"]["consumer_lease_s"] == 10.0
    assert default["broker_transport_options"]["unacked_restore_interval"] == 5
    short = celery_config(WorkerSettings(_env_file=None, redis_url="redis://127.0.0.1:6399/0",
                                         result_ttl_s=120, consumer_lease_s=4))
    assert short["result_expires"] == 120 and short["broker_transport_options"]["unacked_restore_interval"] == 2


def test_redis_config_rides_out_a_broker_restart():
    config = celery_config(WorkerSettings(_env_file=None, redis_url="redis://127.0.0.1:6399/0"))
    assert config["broker_connection_retry"] and config["broker_connection_retry_on_startup"]
    assert config["broker_connection_max_retries"] is None  # a pool never gives up on the broker
    assert config["broker_transport"] == "workers.redis_broker:Transport"
    assert config["worker_cancel_long_running_tasks_on_connection_loss"] is False
    assert config["result_backend_always_retry"] and config["result_backend_max_retries"] >= 10
    options = config["broker_transport_options"]
    assert options["health_check_interval"] > 0 and options["socket_keepalive"]
    assert config["task_publish_retry_policy"]["max_retries"] >= 1
    app = create_app(WorkerSettings(_env_file=None, redis_url="redis://127.0.0.1:6399/0"))
    assert type(app.connection_for_write().transport).__module__ == "workers.redis_broker"
    assert type(app.backend).__name__ == "WriteOnceRedisBackend"
    assert app.backend.url == "redis://127.0.0.1:6399/0"  # Celery's `<backend>+<url>` form


def test_without_redis_the_broker_needs_no_server(tmp_path):
    settings = WorkerSettings(_env_file=None, broker_dir=tmp_path / "broker")
    config = celery_config(settings)
    assert config["broker_url"] == "filesystem://"
    assert config["result_backend"] == f"file://{tmp_path / 'broker' / 'results'}"
    assert all(folder.is_dir() for folder in broker_folders(settings).values())


def test_each_tier_has_its_own_time_limits():
    settings = WorkerSettings(_env_file=None, time_limit_s={"A": 5, "C": 100}, time_limit_grace_s=10)
    assert settings.time_limits(Tier.A) == (5, 15) and settings.time_limits(Tier.C) == (100, 110)
    assert settings.time_limits(Tier.B) == (120, 130)  # a tier left out keeps its default


def test_per_tier_and_per_pool_values_are_mappings_from_the_environment(monkeypatch):
    monkeypatch.setenv("ARAG_CONCURRENCY", '{"A": 4}')
    monkeypatch.setenv("ARAG_TIME_LIMIT", '{"C": 30}')
    settings = WorkerSettings(_env_file=None)
    assert settings.concurrency == {"A": 4, "B": 2, "C": 1, "shadow": 1}
    assert settings.time_limits(Tier.C) == (30, 45)
    monkeypatch.setenv("ARAG_CONCURRENCY", '{"D": 1}')
    with pytest.raises(ValueError, match="unknown pool"):
        WorkerSettings(_env_file=None)


def test_pool_commands_use_their_own_queue_concurrency_and_prefetch(tmp_path):
    settings = WorkerSettings(_env_file=None, concurrency={"C": 3}, prefetch={"A": 8})
    pools = WorkerPools(settings, log_dir=tmp_path, migrate=False)
    c = pools.command("C")
    assert c[c.index("-Q") + 1] == "tier-c" and c[c.index("-n") + 1] == "tier-c@%h"
    assert c[c.index("--concurrency") + 1] == "3" and c[c.index("--prefetch-multiplier") + 1] == "1"
    a = pools.command("A")
    assert a[a.index("--prefetch-multiplier") + 1] == "8"
    with pytest.raises(ValueError):
        WorkerPools(settings, pools=["D"])


def test_worker_processes_read_the_same_settings_back(tmp_path, monkeypatch):
    library = Settings(_env_file=None, index_dir=tmp_path / "index", llm_threads=1, multi_step="ircot")
    workers = WorkerSettings(_env_file=None, redis_url=None, visibility_timeout_s=15.0,
                             time_limit_s={"C": 50})
    env = as_environment(library, workers)
    assert env["REDIS_URL"] is None  # removed from the child's environment
    for key, value in env.items():
        if value is not None:
            monkeypatch.setenv(key, value)
    again, workers_again = Settings(_env_file=None), WorkerSettings(_env_file=None)
    assert (again.index_dir, again.llm_threads, again.multi_step) == (tmp_path / "index", 1, "ircot")
    assert workers_again.visibility_timeout_s == 15.0 and workers_again.time_limit_s[Tier.C] == 50


def test_enqueue_routes_by_tier_with_its_limits_and_queue_depth_counts(tmp_path):
    queue = CeleryTaskQueue(create_app(WorkerSettings(
        _env_file=None, broker_dir=tmp_path / "broker", time_limit_s={"B": 7}, time_limit_grace_s=3)))
    queue.enqueue(task("req1", "B", "single_step"))
    queue.enqueue(task("req1", "C", "decompose", ResultKind.SHADOW))
    depths = {q: queue.depth(q) for q in QUEUES}
    assert depths == {"tier-a": 0, "tier-b": 1, "tier-c": 0, "shadow": 1}
    [message_file] = (tmp_path / "broker" / "queue").glob("*.tier-b.msg")
    message = json.loads(message_file.read_text())
    assert message["headers"]["task"] == "adaptive_rag.answer"
    assert message["headers"]["id"] == "req1"  # the primary run's task id is the request id
    assert message["headers"]["timelimit"] == [10.0, 7.0]  # [hard, soft]
    # What monitors show of the arguments names the request, never the user's query.
    assert message["headers"]["kwargsrepr"] == (
        "{'request_id': 'req1', 'tenant': 'acme', 'tier': 'B', 'kind': 'primary'}")
    assert "pair a bulb" not in message["headers"]["kwargsrepr"] + message["headers"]["argsrepr"]
    with pytest.raises(ValueError):
        queue.depth("tier-d")


def test_tasks_are_typed_messages():
    with pytest.raises(ValueError):
        task("req2", "D", "x")  # no tier D


@pytest.mark.parametrize("kind, tier", [(ResultKind.PRIMARY, Tier.B), (ResultKind.SHADOW, Tier.C)])
def test_a_task_id_reads_back_as_the_run_it_names(kind, tier):
    made = AnswerTask(request_id="0f3a", tenant="acme", query="q", tier=tier, strategy="s", kind=kind,
                      enqueued_at=0.0)
    run = parse_task_id(made.task_id)
    assert (run.request_id, run.kind) == ("0f3a", kind)
    assert run.tier == (tier if kind is ResultKind.SHADOW else None)  # a primary id names no tier
    assert task_id_for(*run) == made.task_id
    with pytest.raises(ValueError):
        parse_task_id("0f3a.bogus.B")


def test_waiting_times_out_as_the_builtin_timeout_error(tmp_path):
    app = create_app(WorkerSettings(_env_file=None, broker_dir=tmp_path / "broker"))
    CeleryTaskQueue(app).enqueue(task("req3", "A", "no_retrieval"))
    waiter = ThreadedResultWaiter(app, threads=1)

    async def wait() -> None:
        try:
            await waiter.wait("req3", timeout=0.2)
        finally:
            await waiter.close()

    with pytest.raises(TimeoutError):
        asyncio.run(wait())


def test_the_server_less_broker_never_shows_a_partial_message(tmp_path, monkeypatch):
    """kombu's own filesystem channel names the file before writing it, so a polling consumer
    could read an empty message and stop the worker; ours renames a complete file into place."""
    import os

    from workers import filesystem_broker

    app = create_app(WorkerSettings(_env_file=None, broker_dir=tmp_path / "broker"))
    with app.connection() as connection:
        assert isinstance(connection.transport, filesystem_broker.Transport)
    queue_dir = tmp_path / "broker" / "queue"
    seen_before_rename = []
    real_replace = os.replace

    def replace(src, dst):
        seen_before_rename.append(sorted(p.name for p in queue_dir.glob("*.tier-a.msg")))
        assert os.path.getsize(src) > 0
        real_replace(src, dst)

    monkeypatch.setattr(filesystem_broker.os, "replace", replace)
    queue = CeleryTaskQueue(app)
    queue.enqueue(task("req4", "A", "no_retrieval"))
    assert seen_before_rename == [[]]  # nothing under a queue's name until the payload was complete
    [message] = queue_dir.glob("*.tier-a.msg")
    assert json.loads(message.read_text())["headers"]["id"] == "req4"
    assert not [p for p in queue_dir.iterdir() if p.name.startswith(".partial-")]


def test_forget_drops_a_finished_runs_stored_result(tmp_path):
    """A request admitted again runs under the same task id: the old result must not answer it."""
    from adaptive_rag.contracts import AnswerResult

    app = create_app(WorkerSettings(_env_file=None, broker_dir=tmp_path / "broker"))
    old = AnswerResult(request_id="req4", tier="B", strategy="single_step", error="down",
                       error_code="dependency_unavailable")
    app.backend.store_result("req4", old.model_dump(mode="json"), "SUCCESS")
    assert app.AsyncResult("req4").state == "SUCCESS"
    queue = CeleryTaskQueue(app)
    queue.forget("req4")
    assert app.AsyncResult("req4").state == "PENDING"
    queue.forget("req4")  # nothing stored: nothing to do
