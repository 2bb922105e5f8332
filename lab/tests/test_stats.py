"""The lab's statistics (`lab.harness.stats`) on values whose answers are known, and its CPU
instruments on a made-up /proc and on this process."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from adaptive_rag.evaluation.bootstrap import bootstrap_mean
from lab.harness.stats import (
    CpuLatencyUnavailable, CpuMeter, block_bootstrap_ratio, cpu_seconds, hold_cpu_latency, mean_interval,
    median, paired_difference_interval, percentile, percentile_ranks, percentile_ratio_interval, percentiles,
    ratio_of_medians_interval, slope,
)

# --- percentiles ----------------------------------------------------------------------------------


def test_percentiles_interpolate_linearly_between_order_statistics() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile(range(1, 11), 95) == pytest.approx(9.55)  # rank 8.55: 9 + 0.55 x (10 - 9)
    assert percentile(range(1, 11), 0) == 1 and percentile(range(1, 11), 100) == 10
    assert percentile([7.0], 99) == 7.0
    assert median([5, 1, 3]) == 3 and median([1, 2]) == 1.5


def test_no_values_have_no_percentile_and_missing_values_are_left_out() -> None:
    assert percentile([], 50) is None and median([]) is None
    assert percentile([None, 1.0, None, 3.0], 50) == 2.0
    assert percentiles([], (50, 99)) == {"p50": None, "p99": None}


def test_percentiles_are_keyed_by_their_rank() -> None:
    assert percentiles(range(101)) == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    assert list(percentiles([1.0], (50, 99.9))) == ["p50", "p99.9"]


def test_the_order_statistics_a_percentile_uses() -> None:
    assert percentile_ranks(5, 50) == (2, 2)  # on the middle value
    assert percentile_ranks(4, 50) == (1, 2)  # between the second and the third
    assert percentile_ranks(10, 95) == (8, 9)
    with pytest.raises(ValueError):
        percentile_ranks(0, 50)


# --- intervals ------------------------------------------------------------------------------------


def test_the_interval_of_a_mean_covers_it_and_is_the_evaluation_protocol_s() -> None:
    values = list(np.random.default_rng(3).normal(10.0, 2.0, 200))
    interval = mean_interval(values)
    assert interval.low < np.mean(values) < interval.high
    assert interval.estimate == pytest.approx(np.mean(values))
    assert interval.high - interval.low < 1.0  # about 4 standard errors of 0.14
    assert interval == bootstrap_mean({"all": values})
    assert mean_interval(values) == interval  # seeded: the same values, the same interval
    assert mean_interval([1.0]) is None and mean_interval([]) is None


def test_a_paired_difference_sees_a_shift_that_the_items_spread_would_hide() -> None:
    rng = np.random.default_rng(5)
    before = list(rng.normal(0.0, 10.0, 100))  # items differ a lot
    after = [b + 1.0 + e for b, e in zip(before, rng.normal(0.0, 0.5, 100))]  # each one 1 higher
    diff = paired_difference_interval(before, after)
    assert 0.7 < diff.low < 1.0 < diff.high < 1.3 and diff.excludes_zero
    with pytest.raises(ValueError):
        paired_difference_interval([1.0], [1.0, 2.0])


def test_a_ratio_of_equal_samples_has_an_interval_around_one() -> None:
    rng = np.random.default_rng(1)
    low, high = percentile_ratio_interval(list(rng.lognormal(3, 0.3, 300)), list(rng.lognormal(3, 0.3, 300)),
                                          95, 1000)
    assert low < 1.0 < high


def test_a_ratio_needs_two_blocks_a_side() -> None:
    assert block_bootstrap_ratio([1.0], [1.0, 2.0], np.mean, 100) is None
    assert ratio_of_medians_interval([[1.0, 2.0]], [[1.0], [2.0]], 100) is None


def test_a_generator_passed_in_draws_on_from_where_it_was() -> None:
    """Several intervals of one report draw from one generator in turn, as `queue_isolation`'s do."""
    num, den = [1.0, 2.0, 3.0, 4.0], [2.0, 2.5, 3.0, 5.0]
    rng = np.random.default_rng(9)
    first, second = (percentile_ratio_interval(num, den, 50, 200, rng) for _ in range(2))
    assert first != second
    assert first == percentile_ratio_interval(num, den, 50, 200, 9)  # a seed: a fresh generator


def test_the_percentile_ratio_draws_as_it_always_did() -> None:
    """The numerator's resamples first, then the denominator's, the percentiles row by row: the
    fair-share and queue-isolation reports' intervals come out as they were written."""
    rng = np.random.default_rng(2)
    a, b = rng.lognormal(3, 0.5, 80), rng.lognormal(3.2, 0.5, 120)
    draw = np.random.default_rng(11)
    pa = np.percentile(a[draw.integers(0, len(a), (500, len(a)))], 95, axis=1)
    pb = np.percentile(b[draw.integers(0, len(b), (500, len(b)))], 95, axis=1)
    expected = tuple(float(x) for x in np.percentile(pa / pb, [2.5, 97.5]))
    assert percentile_ratio_interval(list(a), list(b), 95, 500, 11) == expected


def blocks_of(rng: np.random.Generator, scale: float, n_blocks: int = 10, size: int = 50) -> list[list[float]]:
    """Blocks whose level moves from block to block (the machine's noise), as in a real run."""
    return [list(rng.lognormal(np.log(10 * scale) + rng.normal(0, 0.15), 0.3, size)) for _ in range(n_blocks)]


def test_a_real_halving_of_the_median_is_found() -> None:
    rng = np.random.default_rng(2)
    before, after = blocks_of(rng, 1.0), blocks_of(rng, 0.5)
    low, high = ratio_of_medians_interval(after, before, 500, seed=3)
    assert 0.35 < low < high < 0.7


def test_resampling_blocks_is_wider_than_resampling_requests() -> None:
    """Requests of one block share its level: pooling them as independent understates the
    spread, which is why the interval resamples blocks."""
    rng = np.random.default_rng(4)
    before, after = blocks_of(rng, 1.0), blocks_of(rng, 1.0)
    low, high = ratio_of_medians_interval(after, before, 500, seed=5)
    flat_low, flat_high = ratio_of_medians_interval([[x] for a in after for x in a],
                                                    [[x] for b in before for x in b], 500, seed=5)
    assert low < 1.0 < high
    assert (high - low) > 1.5 * (flat_high - flat_low)


def test_a_block_statistic_sees_whole_blocks() -> None:
    """CPU per answer over the picked blocks: (CPU, answers) pairs, not their ratios averaged."""
    before = [(1.0, 100), (3.0, 100), (2.0, 100)]
    after = [(0.5, 100), (1.5, 100), (1.0, 100)]

    def per_answer(blocks: list[tuple[float, int]]) -> float:
        return sum(cpu for cpu, _ in blocks) / sum(n for _, n in blocks)

    low, high = block_bootstrap_ratio(after, before, per_answer, 500, seed=1)
    assert low <= 0.5 <= high and high < 1.5


def test_slope_is_the_least_squares_one() -> None:
    assert slope([(0, 1.0), (1, 3.0), (2, 5.0), (3, 7.0)]) == pytest.approx(2.0)
    assert slope([(0, 1.0), (1, 3.0)]) is None  # too few points
    assert slope([(1, 1.0), (1, 2.0), (1, 3.0)]) is None  # one x


# --- the CPU --------------------------------------------------------------------------------------


def fake_process(proc: Path, pid: int, ppid: int, cmdline: str, ns_per_thread: list[int]) -> None:
    """A /proc/<pid> with its parent, command line and threads' run time (ns)."""
    folder = proc / str(pid)
    (folder / "task").mkdir(parents=True, exist_ok=True)
    (folder / "stat").write_text(f"{pid} ({cmdline.split()[0]}) S {ppid} 1 1 0")
    (folder / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    for tid, ns in enumerate(ns_per_thread, start=pid * 10):
        (folder / "task" / str(tid)).mkdir(exist_ok=True)
        (folder / "task" / str(tid) / "schedstat").write_text(f"{ns} 0 0\n")


def test_the_meter_sums_each_role_s_processes_and_their_children(tmp_path) -> None:
    proc = tmp_path / "proc"
    fake_process(proc, 100, 1, "python -m services.frontdoor", [1_000_000_000, 500_000_000])
    fake_process(proc, 200, 1, "python -m workers.pools", [100_000_000])
    fake_process(proc, 201, 200, "celery worker", [0])
    fake_process(proc, 300, 1, "locust -f lab/loadtest/locustfile.py", [0])
    fake_process(proc, 400, 1, "sshd", [5_000_000_000])
    meter = CpuMeter({100: "front door", 200: "worker pools"},
                     lambda cmd: "load generator" if "locust" in cmd else None, proc=proc)
    before = meter.snapshot()
    assert set(before) == {100, 200, 201, 300}  # sshd has no role: not read
    fake_process(proc, 100, 1, "python -m services.frontdoor", [1_250_000_000, 750_000_000])
    fake_process(proc, 201, 200, "celery worker", [2_000_000_000])
    fake_process(proc, 202, 200, "celery worker", [300_000_000])  # started in between: all of it
    fake_process(proc, 300, 1, "locust -f lab/loadtest/locustfile.py", [100_000_000])
    used = CpuMeter.used(before, meter.snapshot())
    assert used == pytest.approx({"worker pools": 2.3, "front door": 0.5, "load generator": 0.1})
    assert list(used) == ["worker pools", "front door", "load generator"]  # most first


def test_cpu_seconds_counts_this_process_s_work() -> None:
    before = cpu_seconds([os.getpid()])
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert cpu_seconds([os.getpid()]) - before >= 0.04
    assert cpu_seconds([2**22 + 1]) == 0.0  # no such process: nothing counted


def test_a_held_limit_is_written_and_dropped_with_the_block(tmp_path) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    with hold_cpu_latency(0, device) as held:
        assert held == 0 and device.read_bytes() == b"\x00\x00\x00\x00"
    with hold_cpu_latency(None, device) as held:
        assert held is None


def test_a_limit_that_cannot_be_held_says_why(tmp_path) -> None:
    with pytest.raises(CpuLatencyUnavailable, match="needs root"):
        with hold_cpu_latency(0, tmp_path / "missing"):
            pass
    with pytest.raises(ValueError):
        with hold_cpu_latency(-1, tmp_path / "missing"):
            pass


def test_paired_ratio_of_medians_keeps_what_the_pairs_share():
    from lab.harness.stats import paired_percentile_ratio_interval

    whole = [4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0]
    budget = [w / 2 for w in whole]  # every pair exactly half: no spread left once paired
    cell = paired_percentile_ratio_interval(budget, whole, 50)
    assert cell.estimate == 0.5 and cell.low == 0.5 and cell.high == 0.5 and cell.n == 8
    noisy = paired_percentile_ratio_interval([b * (1.2 if i % 2 else 0.8) for i, b in enumerate(budget)], whole, 50)
    assert noisy.low < 0.5 < noisy.high
    assert paired_percentile_ratio_interval([1.0], [2.0], 50) is None
    with pytest.raises(ValueError):
        paired_percentile_ratio_interval([1.0, 2.0], [1.0], 50)
