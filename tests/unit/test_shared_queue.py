"""The comparison setup of the queue benchmark (`ARAG_SHARED_QUEUE`): every tier's primary task
on one `shared` queue served by one pool with the tier pools' total concurrency; shadow runs keep
their own queue. Filesystem broker, no server."""

from __future__ import annotations

import pytest

import time

from adaptive_rag.contracts import SHARED_QUEUE, AnswerTask, ResultKind
from workers.celery_app import QUEUES, celery_config, create_app
from workers.client import CeleryTaskQueue
from workers.pools import WorkerPools
from workers.settings import WorkerSettings


def task(request_id: str, tier: str, strategy: str, kind: ResultKind = ResultKind.PRIMARY) -> AnswerTask:
    return AnswerTask(request_id=request_id, tenant="acme", query="q", tier=tier, strategy=strategy, kind=kind,
                      enqueued_at=time.time())


def test_shared_queue_is_declared_only_when_asked_for(tmp_path):
    plain = WorkerSettings(_env_file=None, broker_dir=tmp_path / "b1")
    shared = WorkerSettings(_env_file=None, broker_dir=tmp_path / "b2", shared_queue=True)
    assert [q.name for q in celery_config(plain)["task_queues"]] == list(QUEUES)
    assert [q.name for q in celery_config(shared)["task_queues"]] == [*QUEUES, SHARED_QUEUE]


def test_every_tier_goes_to_the_shared_queue(tmp_path):
    queue = CeleryTaskQueue(create_app(WorkerSettings(_env_file=None, broker_dir=tmp_path / "broker",
                                                      shared_queue=True)))
    for number, tier in enumerate("ABC"):
        queue.enqueue(task(f"req{number}", tier, "no_retrieval"))
    queue.enqueue(task("req0", "B", "single_step", ResultKind.SHADOW))
    depths = {q: queue.depth(q) for q in (*QUEUES, SHARED_QUEUE)}
    assert depths == {"tier-a": 0, "tier-b": 0, "tier-c": 0, "shadow": 1, SHARED_QUEUE: 3}


def test_the_shared_pool_has_the_total_concurrency(tmp_path):
    settings = WorkerSettings(_env_file=None, shared_queue=True, concurrency={"A": 2, "B": 2, "C": 1})
    command = WorkerPools(settings, pools=["shared"], log_dir=tmp_path, migrate=False).command("shared")
    assert command[command.index("-Q") + 1] == SHARED_QUEUE
    assert command[command.index("--concurrency") + 1] == "5"
    assert command[command.index("--prefetch-multiplier") + 1] == "1"
    with pytest.raises(ValueError):
        WorkerPools(WorkerSettings(_env_file=None), pools=["shared"], migrate=False)


def test_the_front_door_watches_the_queues_it_sends_to(tmp_path):
    """Depth gauge and worker checks: the shared queue in the comparison setup, not empty tier queues."""
    from types import SimpleNamespace

    from services.frontdoor.server import FrontDoor

    def front_door(shared: bool) -> FrontDoor:
        queue = CeleryTaskQueue(create_app(WorkerSettings(_env_file=None, broker_dir=tmp_path / str(shared),
                                                          shared_queue=shared)))
        return FrontDoor(SimpleNamespace(queue=queue), settings=None, metrics=None)

    assert front_door(shared=False).queues() == sorted(QUEUES)
    assert front_door(shared=True).queues() == sorted([SHARED_QUEUE, "shadow"])
