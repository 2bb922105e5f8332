"""The replicas benchmark's verdict per window (`lab.experiments.replicas.Point.summary`): a rate
holds only when every call of the window was answered OK in time and the p95 is within the bound."""

from __future__ import annotations

from lab.experiments.replicas import GRACE_S, Point, role_of_command
from lab.harness.load_client import CallRecord


def call(start: float, ms: float, code: str = "OK") -> CallRecord:
    return CallRecord("Answer", None, start, start + ms / 1000, code)


def window(calls: list[CallRecord]) -> Point:
    return Point("one", "ladder", 10.0, 1, 10.0, calls=calls)


def test_a_window_of_fast_answers_within_the_bound_is_sustained():
    verdict = window([call(i * 0.1, 20.0) for i in range(100)]).summary(bound_ms=100.0)
    assert verdict["sustained"] and verdict["answered_per_s"] == 10.0 and verdict["reasons"] == []


def test_a_refused_call_a_late_answer_or_a_slow_p95_is_not_sustained():
    refused = window([call(i * 0.1, 20.0) for i in range(99)] + [call(9.9, 5.0, "RESOURCE_EXHAUSTED")])
    assert not refused.summary(100.0)["sustained"]
    late = window([call(i * 0.1, 20.0) for i in range(99)] + [call(9.9, 1000 * (GRACE_S + 1))])
    assert "1 of 100 not answered in time" in late.summary(None)["reasons"]
    slow = window([call(i * 0.1, 20.0 if i % 10 else 400.0) for i in range(100)])
    assert any("p95" in r for r in slow.summary(100.0)["reasons"])


def test_processes_outside_the_stack_are_named_by_their_command_lines():
    assert role_of_command("redis-server 10.77.1.10:6379") == "redis"
    assert role_of_command("nginx: worker process") == "load balancer"
    assert role_of_command("/usr/bin/python -m lab.experiments.replicas") == "load generator (this process)"
    assert role_of_command("bash") is None
