"""The side-by-side overhead benchmark's statistics: the block bootstrap of the latency ratio and
the CPU per Answer table (no services)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from lab.experiments.frontdoor_overhead import (
    Sample,
    bootstrap_ratio,
    by_block,
    cpu_lines,
    cpu_seconds,
    cpu_summary,
)


def blocks_of(rng: np.random.Generator, scale: float, n_blocks: int = 10,
              size: int = 50) -> list[list[float]]:
    """Blocks whose level moves from block to block (the machine's noise), as in a real run."""
    return [list(rng.lognormal(np.log(10 * scale) + rng.normal(0, 0.15), 0.3, size))
            for _ in range(n_blocks)]


def test_same_code_gives_an_interval_around_one() -> None:
    rng = np.random.default_rng(1)
    lo, hi = bootstrap_ratio(blocks_of(rng, 1.0), blocks_of(rng, 1.0), 500, seed=3)
    assert lo < 1.0 < hi


def test_a_real_halving_is_found() -> None:
    rng = np.random.default_rng(2)
    lo, hi = bootstrap_ratio(blocks_of(rng, 1.0), blocks_of(rng, 0.5), 500, seed=3)
    assert 0.35 < lo < hi < 0.7


def test_resampling_blocks_is_wider_than_resampling_requests() -> None:
    """Requests of one block share its level: pooling them as independent understates the
    spread, which is why the interval resamples blocks."""
    rng = np.random.default_rng(4)
    before, after = blocks_of(rng, 1.0), blocks_of(rng, 1.0)
    lo, hi = bootstrap_ratio(before, after, 500, seed=5)
    flat_lo, flat_hi = bootstrap_ratio([[x] for b in before for x in b],
                                       [[x] for a in after for x in a], 500, seed=5)
    assert (hi - lo) > 1.5 * (flat_hi - flat_lo)


def test_by_block_keeps_answered_calls_per_block() -> None:
    samples = [
        Sample("after", 4, 1, total_ms=10.0, queue_wait_ms=1.0, strategy_ms=2.0),
        Sample("after", 4, 1, status="UNAVAILABLE"),
        Sample("after", 4, 3, total_ms=8.0, queue_wait_ms=1.0, strategy_ms=1.0),
        Sample("after", 4, 1, total_ms=9.0, queue_wait_ms=0.5, strategy_ms=0.5),
    ]
    assert by_block(samples) == [[7.0, 8.0], [6.0]]


def block(tree: str, cpu_fd: float, cpu_pools: float, answered: int, concurrency: int = 4) -> dict:
    return {"concurrency": concurrency, "tree": tree, "answered": answered,
            "cpu_s": {"front door": cpu_fd, "worker pools": cpu_pools}}


def test_cpu_per_answer_is_all_blocks_cpu_over_all_their_answers() -> None:
    blocks = [block("before", 0.4, 0.5, 100), block("before", 0.5, 0.4, 100),
              block("after", 0.35, 0.4, 100), block("after", 0.4, 0.35, 100)]
    cpu = cpu_summary(blocks, [4], 200, seed=1)
    rows = {r["tree"]: r for r in cpu["rows"]}
    assert rows["before"]["cpu_ms_per_answer"] == pytest.approx({"front door": 4.5, "worker pools": 4.5})
    assert rows["before"]["total_ms"] == pytest.approx(9.0)
    assert rows["after"]["total_ms"] == pytest.approx(7.5)
    (ratio,) = cpu["ratios"]
    assert ratio["total"] == pytest.approx(7.5 / 9.0)
    assert ratio["total_ci95"][0] <= ratio["total"] <= ratio["total_ci95"][1]
    table = "\n".join(cpu_lines(cpu))
    assert "| 4 | after | 200 | 3.75 | 3.75 | 7.50 | 0.83x" in table


def test_cpu_summary_skips_a_level_without_cpu_readings() -> None:
    blocks = [{"concurrency": 1, "tree": t, "answered": 50} for t in ("before", "after")]
    assert cpu_summary(blocks, [1], 100, seed=1) == {"rows": [], "ratios": []}
    assert cpu_lines(cpu_summary(blocks, [1], 100, seed=1)) == []


def test_cpu_seconds_counts_this_process_s_work() -> None:
    before = cpu_seconds([os.getpid()])
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert cpu_seconds([os.getpid()]) - before >= 0.04
    assert cpu_seconds([2**22 + 1]) == 0.0  # no such process: nothing counted
