"""When a pool dies, the messages it had reserved go back to its queue at once (`restore_reserved`
on a fake kombu Redis channel), not after the visibility timeout; the supervisor does it for the
queue of the pool that exited."""

from __future__ import annotations

import json
from pathlib import Path

from workers.pools import Pool, PoolHealth, RestartPolicy, WorkerPools, restore_reserved
from workers.settings import WorkerSettings


class FakeClient:
    def __init__(self, unacked: dict[bytes, bytes], index: dict[bytes, float]) -> None:
        self.unacked, self.index = unacked, index

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        assert key == "unacked"
        return dict(self.unacked)

    def zscore(self, key: str, tag: bytes) -> float | None:
        assert key == "unacked_index"
        return self.index.get(tag)


class FakeQoS:
    def __init__(self) -> None:
        self.restored: list[tuple[bytes, bool]] = []

    def restore_by_tag(self, tag: bytes, client=None, leftmost: bool = False) -> None:
        self.restored.append((tag, leftmost))


class FakeChannel:
    unacked_key = "unacked"
    unacked_index_key = "unacked_index"

    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.qos = FakeQoS()


def entry(queue: str) -> bytes:
    return json.dumps([{"body": "...", "headers": {}}, "", queue]).encode()


def test_only_the_dead_pools_queue_and_only_messages_delivered_before_its_death() -> None:
    client = FakeClient(
        unacked={b"t1": entry("tier-b"), b"t2": entry("tier-b"), b"t3": entry("tier-a"),
                 b"t4": entry("tier-b"), b"t5": b"not json"},
        index={b"t1": 100.0, b"t2": 150.0, b"t3": 100.0, b"t4": 250.0, b"t5": 100.0},
    )
    channel = FakeChannel(client)
    restored = restore_reserved(channel, "tier-b", before=200.0)
    assert sorted(restored) == ["t1", "t2"]
    assert sorted(channel.qos.restored) == [(b"t1", True), (b"t2", True)]  # to the head of the queue


def test_a_message_acknowledged_meanwhile_is_left_alone() -> None:
    client = FakeClient(unacked={b"t1": entry("tier-b")}, index={})  # gone from the index: acked
    channel = FakeChannel(client)
    assert restore_reserved(channel, "tier-b", before=200.0) == []


class FakeProcess:
    pid = 4242

    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


def test_the_supervisor_restores_the_exited_pools_queue_once() -> None:
    pools = WorkerPools(WorkerSettings(_env_file=None), pools=("B",), migrate=False)
    proc = FakeProcess()
    pools.pools["B"] = Pool("B", "tier-b", proc, Path("/dev/null"))  # type: ignore[arg-type]
    pools.health["B"] = PoolHealth(started_at=0.0)
    pools._reap = lambda pool: None  # type: ignore[method-assign]
    restored: list[str] = []
    pools._restore_reserved = restored.append  # type: ignore[method-assign]
    policy = RestartPolicy(first_backoff_s=5.0)
    assert pools.supervise_once(policy, now=lambda: 100.0) == []
    assert restored == []  # alive: nothing to restore
    proc.returncode = -9
    pools.supervise_once(policy, now=lambda: 101.0)
    pools.supervise_once(policy, now=lambda: 102.0)  # still waiting for its backoff
    assert restored == ["tier-b"]


def test_without_redis_there_is_nothing_to_restore() -> None:
    pools = WorkerPools(WorkerSettings(_env_file=None, redis_url=None), pools=("B",), migrate=False)
    pools._restore_reserved("tier-b")  # no broker connection is attempted
