"""The queue-isolation benchmark's pure parts: the interleaved schedule, the exact tier mix, the
backlog size, the per-tier summary with censored waits, and the shared/separate ratio with its
1 ms floor and bootstrap interval."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from lab.experiments.queue_isolation import (
    FLOOR_MS, Sample, _ratio, backlog_size, block_schedule, busy_share, lower_bound, markdown,
    plan_round, ratios, summarize, tier_sequence, wait_ratio,
)


def sample(tier: str, wait: float, *, censored: bool = False, strategy: float = 200.0) -> Sample:
    s = Sample(tier, f"{tier}-{wait}-{random.random()}", 0.0, tier=tier, queue_wait_ms=wait,
               censored=censored)
    if not censored:
        s.strategy_ms, s.total_ms = strategy, strategy + wait + 5.0
    else:
        s.status = "DEADLINE_EXCEEDED"
    return s


def test_every_round_runs_each_setup_and_phase_once_in_counterbalanced_order():
    schedule = block_schedule(3)
    assert len(schedule) == 12
    for r in (1, 2, 3):
        cells = [(m, p) for rr, m, p in schedule if rr == r]
        assert sorted(cells) == sorted({(m, p) for m in ("separate", "shared")
                                        for p in ("steady", "backlog")})
    first = [(m, p) for r, m, p in schedule if r == 1]
    second = [(m, p) for r, m, p in schedule if r == 2]
    assert second == first[::-1]
    # Interleaved: the setup changes within every round, never all of one then all of the other.
    assert first[0][0] != first[1][0]


@pytest.mark.parametrize("count", [1, 7, 10, 120, 121])
def test_the_tier_mix_is_exact_not_random(count):
    mix = {"A": 0.6, "B": 0.3, "C": 0.1}
    seq = tier_sequence(count, mix, random.Random(3))
    counts = Counter(seq)
    assert len(seq) == count
    for tier, share in mix.items():
        assert abs(counts[tier] - count * share) < 1
    if count == 120:
        assert counts == {"A": 72, "B": 36, "C": 12}


def test_a_round_plan_is_the_same_for_every_block_and_differs_between_rounds():
    queries = {"A": ["a1", "a2"], "B": ["b1"], "C": ["c1", "c2"]}
    mix = {"A": 0.6, "B": 0.3, "C": 0.1}
    assert plan_round(queries, mix, 50, 8) == plan_round(queries, mix, 50, 8)
    assert plan_round(queries, mix, 50, 8) != plan_round(queries, mix, 50, 9)
    assert all(q in queries[t] for t, q in plan_round(queries, mix, 50, 8))


def test_the_backlog_outlasts_the_block_even_for_the_whole_pool():
    n = backlog_size(processes=5, window_s=50.0, c_service_s=0.6, margin=1.5)
    assert n == 625
    assert n * 0.6 / 5 > 50.0  # the pool, on nothing but C, needs longer than the block


def test_summary_marks_percentiles_reaching_censored_waits_as_lower_bounds():
    samples = [sample("A", w) for w in (1, 2, 3, 4)] + [sample("A", 1000, censored=True)]
    row = summarize(samples)["A"]
    assert (row["sent"], row["answered"], row["censored"]) == (5, 4, 1)
    assert row["queue_wait_p50_ms"] == 3.0 and not row["queue_wait_p50_lower_bound"]
    assert row["queue_wait_p95_lower_bound"]
    assert row["errors"] == {"DEADLINE_EXCEEDED": 1}
    assert row["strategy_p50_ms"] == 200.0


def test_the_ratio_floors_the_separate_waits_at_one_ms():
    rng = np.random.default_rng(0)
    r = wait_ratio([10.0] * 20, [0.1] * 20, 50, 200, rng)
    assert r["ratio"] == pytest.approx(10.0 / FLOOR_MS)
    assert r["ci95"] == pytest.approx([10.0, 10.0])


def test_the_interval_covers_the_ratio_of_two_noisy_setups():
    rng = np.random.default_rng(1)
    sep = list(rng.exponential(10.0, 300))
    shared = list(rng.exponential(30.0, 300))
    r = wait_ratio(shared, sep, 50, 1000, np.random.default_rng(2))
    low, high = r["ci95"]
    assert low < r["ratio"] < high
    assert low < 3.0 < high


def test_ratios_per_tier_and_phase_carry_the_lower_bound_flag():
    cells = {
        ("separate", "steady"): [sample("A", w) for w in range(1, 11)],
        ("shared", "steady"): [sample("A", 2 * w) for w in range(1, 11)],
        ("separate", "backlog"): [sample("A", w) for w in range(1, 11)],
        ("shared", "backlog"): [sample("A", 5000.0 + w, censored=True) for w in range(10)],
    }
    summaries = {f"{m}/{p}": summarize(s) for (m, p), s in cells.items()}
    out = ratios(cells, summaries, 200, 0)
    assert set(out) == {"A"}  # no B or C samples
    assert out["A"]["steady"]["p50"]["ratio"] == pytest.approx(2.0)
    assert not out["A"]["steady"]["p50"]["lower_bound"]
    assert out["A"]["backlog"]["p50"]["lower_bound"]


def test_busy_share_is_strategy_time_over_process_time():
    samples = [sample("A", 1.0, strategy=500.0) for _ in range(8)] + [sample("C", 1.0, strategy=1000.0)]
    assert busy_share(samples, ("A",), processes=2, window_s=10.0) == pytest.approx(0.2)
    assert busy_share(samples, ("A", "B", "C"), processes=4, window_s=10.0) == pytest.approx(0.125)
    assert busy_share(samples, ("A",), processes=0, window_s=10.0) is None


def test_the_markdown_names_the_device_and_flags_a_smoke_run():
    cells = {("separate", "steady"): [sample("A", 1.0)], ("shared", "steady"): [sample("A", 2.0)]}
    summaries = {f"{m}/{p}": summarize(s) for (m, p), s in cells.items()}
    pools = {"separate": {"A": {"processes": 2, "prefetch": 1, "command": "celery -A x"}},
             "shared": {"shared": {"processes": 2, "prefetch": 1, "command": "celery -A y"}}}
    report = {
        "command": "cmd", "started": "t0", "finished": "t1", "seconds": 60.0,
        "machine": {"cpus": 2, "cpu": "cpu", "platform": "linux"},
        "load_average_start": [1.0, 1.0, 1.0], "load_average_end": [2.0, 2.0, 2.0],
        "config": {"rate": 3.0, "duration_s": 10.0, "drain_s": 5.0, "rounds": 1, "settle_s": 1.0,
                   "per_block": 30, "per_block_by_tier": {"A": 18, "B": 9, "C": 3},
                   "llm_latency_ms": 200.0, "top_k": 3, "max_steps": 2, "total_processes": 2,
                   "backlog": 10, "backlog_auto": True, "backlog_margin": 1.5, "c_service_s": 0.6,
                   "bootstrap": 100},
        "setups": {m: {"redis_db": i, "queues": [m], "pools": pools[m]}
                   for i, m in enumerate(("separate", "shared"))},
        "service_times_ms": {"A": [200.0], "B": [210.0], "C": [600.0]},
        "schedule": [[1, "separate", "steady"], [1, "shared", "steady"]],
        "cells": summaries,
        "cell_facts": {"separate/steady": {"blocks": 1, "sent": 1, "achieved_rate": 3.0,
                                           "late_p95_ms": 0.1, "late_max_ms": 0.2,
                                           "busy_share": {"A": 0.2}}},
        "ratios": ratios(cells, summaries, 50, 0),
        "blocks": [],
    }
    text = markdown(report)
    assert "measurement device" in text and "200 ms per completion" in text
    assert "prefetch 1" in text
    assert "Fewer than 200 tier-A requests" in text


def test_a_percentile_interpolating_towards_a_censored_wait_is_a_lower_bound():
    values = [1.0, 2.0, 3.0, 4.0, 1000.0]
    assert lower_bound(values, [1000.0], 95)  # 800.8 leans on the censored 1000
    assert not lower_bound(values, [1000.0], 50)
    assert not lower_bound(values, [], 95)
    assert lower_bound([5.0, 6.0], [5.0], 50)


def test_ratio_text_marks_bounds_and_refuses_a_bound_over_a_bound():
    plain = {"ratio": 1.0234, "ci95": [0.91, 1.1], "lower_bound": False, "denominator_lower_bound": False}
    assert _ratio(plain) == "1.02x [0.91, 1.10]"
    bound = {**plain, "ratio": 3208.1, "ci95": [2278.3, 4130.7], "lower_bound": True}
    assert _ratio(bound) == ">=3,208x [2,278, 4,131]"
    assert _ratio({**bound, "denominator_lower_bound": True}) == "- (both censored)"
