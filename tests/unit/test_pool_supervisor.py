"""The pool supervisor's decisions (`WorkerPools.supervise_once`) on a fake clock and fake
processes: a pool that exits is started again after a backoff that doubles with each quick crash
and resets once the pool stayed up; the other pools are left alone. The real processes are in
tests/integration/test_broker_restart.py."""

from __future__ import annotations

from pathlib import Path

from workers.pools import Pool, PoolHealth, RestartPolicy, WorkerPools
from workers.settings import WorkerSettings


class FakeProcess:
    _pids = iter(range(10_000_000, 20_000_000))

    def __init__(self) -> None:
        self.pid = next(self._pids)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def supervised(names=("A", "B"), clock: Clock | None = None) -> tuple[WorkerPools, Clock, list[str]]:
    clock = clock or Clock()
    pools = WorkerPools(WorkerSettings(_env_file=None), pools=names, migrate=False)
    started: list[str] = []

    def start_pool(name: str, wait: bool = True) -> Pool:
        started.append(name)
        pool = Pool(name, f"q-{name}", FakeProcess(), Path("/dev/null"))  # type: ignore[arg-type]
        pools.pools[name] = pool
        health = pools.health.setdefault(name, PoolHealth(started_at=clock()))
        health.started_at, health.restart_at = clock(), None
        return pool

    pools.start_pool = start_pool  # type: ignore[method-assign]
    pools._reap = lambda pool: None  # type: ignore[method-assign]  # fake pids: nothing to reap
    for name in names:
        start_pool(name)
    started.clear()
    return pools, clock, started


POLICY = RestartPolicy(first_backoff_s=1.0, max_backoff_s=8.0, stable_after_s=60.0)


def test_backoff_doubles_up_to_its_cap():
    assert [POLICY.backoff(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_a_crashed_pool_is_restarted_after_its_backoff_and_the_others_keep_running():
    pools, clock, _ = supervised()
    survivor = pools.pools["B"]
    pools.pools["A"].process.returncode = -9  # SIGKILL
    assert pools.supervise_once(POLICY, now=clock) == []  # noticed, restart scheduled
    assert pools.health["A"].exit_codes == [-9]
    clock.t += 0.5
    assert pools.supervise_once(POLICY, now=clock) == []  # still backing off
    clock.t += 0.6
    assert pools.supervise_once(POLICY, now=clock) == ["A"]
    assert pools.restarts == {"A": 1, "B": 0}
    assert pools.pools["B"] is survivor and survivor.alive()


def test_quick_crashes_back_off_longer_and_a_stable_pool_starts_over():
    pools, clock, _ = supervised(("C",))

    def crash_and_wait() -> float:
        """Crash C now; how long until it is started again."""
        pools.pools["C"].process.returncode = 1
        pools.supervise_once(POLICY, now=clock)
        crashed_at = clock.t
        while not pools.supervise_once(POLICY, now=clock):
            clock.t += 0.25
        return clock.t - crashed_at

    assert [crash_and_wait() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    clock.t += 61  # up for a minute: the next crash is repaired at once again
    pools.supervise_once(POLICY, now=clock)
    assert crash_and_wait() == 1.0
    assert pools.restarts["C"] == 6


def test_nothing_is_restarted_once_the_pools_are_stopping():
    pools, clock, started = supervised(("A",))
    pools.pools["A"].process.returncode = 1
    pools._stopping.set()
    clock.t += 100
    assert pools.supervise_once(POLICY, now=clock) == [] and started == []
