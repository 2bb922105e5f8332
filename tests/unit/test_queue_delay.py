"""The wait-budget gate (`adaptive_rag/serving/queue_delay.py`): CoDel's standing-queue test on
the queue waits of finished tasks, per tier, over a sliding interval."""

from __future__ import annotations

import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.serving.queue_delay import DepthEstimate, QueueDelayGate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gate(**kwargs) -> tuple[QueueDelayGate, Clock]:
    clock = Clock()
    return QueueDelayGate({Tier.A: 1.0, Tier.B: 0.0}, interval_s=2.0, min_samples=3, clock=clock, **kwargs), clock


def test_a_queue_stands_only_when_even_its_shortest_recent_wait_is_over_target() -> None:
    g, clock = gate()
    for wait in (1.5, 2.0):
        g.observe(Tier.A, wait)
    assert g.standing(Tier.A) is None  # two finished tasks: too few to tell
    g.observe(Tier.A, 1.2)
    standing = g.standing(Tier.A)
    assert standing is not None and standing.shortest_wait_s == 1.2 and standing.samples == 3
    g.observe(Tier.A, 0.3)  # one task went through quickly: the queue drained once, a burst
    assert g.standing(Tier.A) is None


def test_the_window_slides_and_an_empty_window_leaves_the_gate_open() -> None:
    g, clock = gate()
    g.observe(Tier.A, 0.1)
    clock.now += 1.0
    for _ in range(3):
        g.observe(Tier.A, 3.0)
    assert g.standing(Tier.A) is None  # the short wait is still inside the 2 s window
    clock.now += 1.5
    assert g.standing(Tier.A) is not None  # ... and now it has left it
    clock.now += 2.5
    assert g.standing(Tier.A) is None  # nothing finished lately: no evidence, open


def test_tiers_without_a_target_and_other_tiers_are_never_refused() -> None:
    g, _ = gate()
    for _ in range(5):
        g.observe(Tier.B, 60.0)
        g.observe(Tier.C, 60.0)
    assert g.standing(Tier.B) is None and g.standing(Tier.C) is None and g.standing(Tier.A) is None


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        QueueDelayGate({Tier.A: 1.0}, interval_s=0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_depth_is_read_again_only_once_older_than_its_max_age_and_counts_what_was_added():
    clock, reads = Clock(), []

    def read(queue: str) -> int:
        reads.append(queue)
        return 5

    depths = DepthEstimate(0.05, clock)
    assert depths.depth("tier-a", read) == (5, True)
    depths.added("tier-a")
    depths.added("tier-a")
    clock.now = 0.049
    assert depths.depth("tier-a", read) == (7, False)  # the read plus what this replica queued
    assert depths.depth("tier-b", read) == (5, True)  # each queue has its own read
    clock.now = 0.05
    assert depths.depth("tier-a", read) == (5, True)  # old enough: the broker's figure again
    assert reads == ["tier-a", "tier-b", "tier-a"]


def test_depth_with_no_max_age_is_read_for_every_admission():
    clock, reads = Clock(), []
    depths = DepthEstimate(0.0, clock)
    for _ in range(3):
        assert depths.depth("tier-c", lambda q: reads.append(q) or len(reads)) == (len(reads), True)
    assert reads == ["tier-c"] * 3


def test_a_failed_read_is_raised_and_leaves_no_figure_behind():
    depths = DepthEstimate(10.0, Clock())

    def unreachable(queue: str) -> int:
        raise ConnectionError("broker away")

    with pytest.raises(ConnectionError):
        depths.depth("tier-a", unreachable)
    assert depths.depth("tier-a", lambda q: 3) == (3, True)
