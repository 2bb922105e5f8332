"""The side-by-side overhead benchmark's statistics: the overhead per block, the CPU per Answer
table (no services); the interval itself is `lab.harness.stats`' (lab/tests/test_stats.py)."""

from __future__ import annotations

import pytest

from lab.experiments.frontdoor_overhead import Sample, by_block, cpu_lines, cpu_summary, summarize
from lab.harness.load_client import CallRecord


def test_by_block_keeps_answered_calls_per_block() -> None:
    samples = [
        Sample("after", 4, 1, total_ms=10.0, queue_wait_ms=1.0, strategy_ms=2.0),
        Sample("after", 4, 1, status="UNAVAILABLE"),
        Sample("after", 4, 3, total_ms=8.0, queue_wait_ms=1.0, strategy_ms=1.0),
        Sample("after", 4, 1, total_ms=9.0, queue_wait_ms=0.5, strategy_ms=0.5),
    ]
    assert by_block(samples) == [[7.0, 8.0], [6.0]]


def test_a_sample_is_the_load_client_s_record_of_one_answer() -> None:
    call = CallRecord("Answer", "c1", 10.0, 10.025, "OK", request_id="r1", tier="B", total_ms=20.0,
                      queue_wait_ms=2.0, strategy_ms=8.0, classify_ms=1.0, fallback=False, model_version=3)
    sample = Sample.of(call, "after", 4, 7)
    assert (sample.tree, sample.concurrency, sample.block, sample.status, sample.tier) == ("after", 4, 7, "OK", "B")
    assert sample.client_ms == pytest.approx(25.0)
    assert sample.overhead_ms == pytest.approx(10.0)
    refused = Sample.of(CallRecord("Answer", "c2", 10.0, 10.001, "UNAVAILABLE"), "after", 4, 7)
    assert refused.status == "UNAVAILABLE" and refused.overhead_ms is None


def test_the_ratio_of_medians_is_after_over_before_with_its_block_interval() -> None:
    samples = [Sample(tree, 1, b, client_ms=12.0, total_ms=level * (10.0 + i % 3), queue_wait_ms=0.0, strategy_ms=0.0)
               for tree, level in (("before", 1.0), ("after", 0.5)) for b in range(6) for i in range(10)]
    (ratio,) = summarize(samples, [1], 200, seed=1)["ratios"]
    assert ratio["p50"] == pytest.approx(0.5)
    assert ratio["p50_ci95"] == pytest.approx([0.5, 0.5])
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
