"""The comparison setup of the queue benchmark (`ARAG_SHARED_QUEUE`): every tier's primary task
on one `shared` queue served by one pool with the tier pools' total concurrency; shadow runs keep
their own queue. Filesystem broker, no server."""

from __future__ import annotations

import pytest

from adaptive_rag.settings import Settings
from workers import dispatch
from workers.celery_app import QUEUES, SHARED_QUEUE, celery_config, create_app
from workers.pools import WorkerPools


def test_shared_queue_is_declared_only_when_asked_for(tmp_path):
    plain = Settings(_env_file=None, broker_dir=tmp_path / "b1")
    shared = Settings(_env_file=None, broker_dir=tmp_path / "b2", shared_queue=True)
    assert [q.name for q in celery_config(plain)["task_queues"]] == list(QUEUES)
    assert [q.name for q in celery_config(shared)["task_queues"]] == [*QUEUES, SHARED_QUEUE]


def test_every_tier_goes_to_the_shared_queue(tmp_path):
    app = create_app(Settings(_env_file=None, broker_dir=tmp_path / "broker", shared_queue=True))
    for number, tier in enumerate("ABC"):
        dispatch.enqueue(f"req{number}", "q", tier, "no_retrieval", app=app)
    dispatch.enqueue("req0", "q", "B", "single_step", kind="shadow", app=app)
    depths = {q: dispatch.queue_depth(q, app=app) for q in (*QUEUES, SHARED_QUEUE)}
    assert depths == {"tier-a": 0, "tier-b": 0, "tier-c": 0, "shadow": 1, SHARED_QUEUE: 3}


def test_the_shared_pool_has_the_total_concurrency(tmp_path):
    settings = Settings(_env_file=None, shared_queue=True, concurrency_a=2, concurrency_b=2,
                        concurrency_c=1)
    command = WorkerPools(settings, pools=["shared"], log_dir=tmp_path, migrate=False).command("shared")
    assert command[command.index("-Q") + 1] == SHARED_QUEUE
    assert command[command.index("--concurrency") + 1] == "5"
    assert command[command.index("--prefetch-multiplier") + 1] == "1"
    with pytest.raises(ValueError):
        WorkerPools(Settings(_env_file=None), pools=["shared"], migrate=False)
