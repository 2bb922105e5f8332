"""Queue configuration without any server: Celery settings from `Settings`, the worker pool
command lines, settings passed to worker processes, and dispatch on the filesystem broker."""

from __future__ import annotations

import json

import pytest

from adaptive_rag.settings import Settings
from workers import dispatch
from workers.celery_app import QUEUES, broker_folders, celery_config, create_app
from workers.pools import WorkerPools, settings_env


def test_redis_config_keeps_messages_until_the_task_finished():
    settings = Settings(_env_file=None, redis_url="redis://127.0.0.1:6399/0", visibility_timeout_s=40)
    config = celery_config(settings)
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]
    assert config["broker_url"] == config["result_backend"] == "redis://127.0.0.1:6399/0"
    options = config["broker_transport_options"]
    assert options["visibility_timeout"] == 40 and options["unacked_restore_interval"] <= 10
    assert [q.name for q in config["task_queues"]] == list(QUEUES) == [
        "tier-a", "tier-b", "tier-c", "shadow"]


def test_without_redis_the_broker_needs_no_server(tmp_path):
    settings = Settings(_env_file=None, broker_dir=tmp_path / "broker")
    config = celery_config(settings)
    assert config["broker_url"] == "filesystem://"
    assert config["result_backend"] == f"file://{tmp_path / 'broker' / 'results'}"
    assert all(folder.is_dir() for folder in broker_folders(settings).values())


def test_each_tier_has_its_own_time_limits():
    settings = Settings(_env_file=None, time_limit_a_s=5, time_limit_c_s=100, time_limit_grace_s=10)
    assert settings.time_limits("A") == (5, 15) and settings.time_limits("C") == (100, 110)


def test_pool_commands_use_their_own_queue_concurrency_and_prefetch(tmp_path):
    settings = Settings(_env_file=None, concurrency_c=3, prefetch_a=8)
    pools = WorkerPools(settings, log_dir=tmp_path, migrate=False)
    c = pools.command("C")
    assert c[c.index("-Q") + 1] == "tier-c" and c[c.index("-n") + 1] == "tier-c@%h"
    assert c[c.index("--concurrency") + 1] == "3" and c[c.index("--prefetch-multiplier") + 1] == "1"
    a = pools.command("A")
    assert a[a.index("--prefetch-multiplier") + 1] == "8"
    with pytest.raises(ValueError):
        WorkerPools(settings, pools=["D"])


def test_worker_processes_read_the_same_settings_back(tmp_path, monkeypatch):
    settings = Settings(
        _env_file=None, redis_url=None, index_dir=tmp_path / "index", llm_threads=1,
        visibility_timeout_s=15.0, multi_step="ircot",
    )
    env = settings_env(settings)
    assert env["REDIS_URL"] is None  # removed from the child's environment
    for key, value in env.items():
        if value is not None:
            monkeypatch.setenv(key, value)
    again = Settings(_env_file=None)
    assert (again.index_dir, again.llm_threads, again.visibility_timeout_s, again.multi_step) == (
        tmp_path / "index", 1, 15.0, "ircot")


def test_enqueue_routes_by_tier_with_its_limits_and_queue_depth_counts(tmp_path):
    app = create_app(Settings(_env_file=None, broker_dir=tmp_path / "broker", time_limit_b_s=7,
                              time_limit_grace_s=3))
    handle = dispatch.enqueue("req1", "How do I pair a bulb?", "B", "single_step", app=app)
    dispatch.enqueue("req1", "How do I pair a bulb?", "C", "decompose", kind="shadow", app=app)
    assert handle.id == "req1" == dispatch.result_for("req1", app=app).id
    depths = {q: dispatch.queue_depth(q, app=app) for q in QUEUES}
    assert depths == {"tier-a": 0, "tier-b": 1, "tier-c": 0, "shadow": 1}
    [message_file] = (tmp_path / "broker" / "queue").glob("*.tier-b.msg")
    message = json.loads(message_file.read_text())
    assert message["headers"]["task"] == "adaptive_rag.answer"
    assert message["headers"]["timelimit"] == [10.0, 7.0]  # [hard, soft]
    with pytest.raises(ValueError):
        dispatch.enqueue("req2", "q", "D", "x", app=app)
    with pytest.raises(ValueError):
        dispatch.queue_depth("tier-d", app=app)


def test_wait_result_times_out_as_the_builtin_timeout_error(tmp_path):
    app = create_app(Settings(_env_file=None, broker_dir=tmp_path / "broker"))
    handle = dispatch.enqueue("req3", "q", "A", "no_retrieval", app=app)
    with pytest.raises(TimeoutError):
        dispatch.wait_result(handle, timeout=0.2)
