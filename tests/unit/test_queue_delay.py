"""The wait-budget gate (`adaptive_rag/serving/queue_delay.py`): CoDel's standing-queue test on
the queue waits of finished tasks, per tier, over a sliding interval."""

from __future__ import annotations

import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.serving.queue_delay import QueueDelayGate


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
