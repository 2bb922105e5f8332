"""Bootstrap intervals of the evaluation report: a row's mean F1 and paired differences."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive_rag.evaluation.bootstrap import (
    Interval, bootstrap_mean, difference_interval, mean_interval, ratio_interval,
)


def bernoulli(n: int, p: float = 0.3, seed: int = 1) -> list[float]:
    return np.random.default_rng(seed).binomial(1, p, n).astype(float).tolist()


def keyed(values: list[float], dataset: str = "nq") -> dict[tuple[str, str], float]:
    return {(dataset, str(i)): v for i, v in enumerate(values)}


def width(interval: Interval) -> float:
    return interval.high - interval.low


def test_interval_contains_the_mean_and_is_seeded() -> None:
    values = bernoulli(200)
    interval = bootstrap_mean({"nq": values})
    assert interval is not None
    assert interval.estimate == pytest.approx(sum(values) / len(values))
    assert interval.low < interval.estimate < interval.high
    assert interval.n == 200
    assert bootstrap_mean({"nq": values}) == interval  # the same seed, the same interval
    assert bootstrap_mean({"nq": values}, seed=7) != interval


def test_interval_shrinks_with_more_questions() -> None:
    small = mean_interval(keyed(bernoulli(50)))
    large = mean_interval(keyed(bernoulli(5000)))
    assert small is not None and large is not None
    assert width(large) < width(small) / 5  # about 1 / sqrt(100)
    assert large.low < 0.3 < large.high


def test_average_weighs_datasets_equally() -> None:
    interval = bootstrap_mean({"squad": [1.0], "hotpotqa": [0.0] * 99})
    assert interval is not None
    assert interval.estimate == pytest.approx(0.5)  # not 1 / 100 pooled over questions
    assert interval.n == 100
    assert interval.low == interval.high == pytest.approx(0.5)  # every resample is the same


def test_difference_of_identical_rows_is_exactly_zero() -> None:
    row = {**keyed(bernoulli(80)), **keyed(bernoulli(60, seed=2), "2wiki")}
    interval = difference_interval(row, dict(row))
    assert interval is not None
    assert (interval.estimate, interval.low, interval.high) == (0.0, 0.0, 0.0)
    assert not interval.excludes_zero


def test_paired_difference_sees_a_consistent_gain_that_single_intervals_hide() -> None:
    noisy = np.random.default_rng(3).uniform(0, 1, 100)
    a = keyed([float(v) + 0.05 for v in noisy])
    b = keyed([float(v) for v in noisy])
    alone_a, alone_b = mean_interval(a), mean_interval(b)
    assert alone_a is not None and alone_b is not None
    assert alone_a.low < alone_b.high  # the rows' own intervals overlap...
    diff = difference_interval(a, b)
    assert diff is not None
    assert diff.estimate == pytest.approx(0.05)
    assert diff.low == pytest.approx(0.05) and diff.high == pytest.approx(0.05)
    assert diff.excludes_zero  # ...but question by question a always wins


def test_difference_uses_only_the_questions_both_rows_answered() -> None:
    a = keyed([1.0, 1.0, 0.0])
    b = {("nq", "0"): 0.0, ("nq", "1"): 1.0}
    diff = difference_interval(a, b)
    assert diff is not None
    assert diff.n == 2 and diff.estimate == pytest.approx(0.5)
    assert not diff.excludes_zero  # [0, 1] touches 0


def test_no_values_no_interval() -> None:
    assert bootstrap_mean({}) is None and bootstrap_mean({"nq": []}) is None
    assert difference_interval(keyed([1.0]), keyed([1.0], "2wiki")) is None


def test_interval_as_dict_states_whether_it_excludes_zero() -> None:
    assert Interval(0.1, 0.02, 0.2, 10).as_dict() == {
        "estimate": 0.1, "low": 0.02, "high": 0.2, "n": 10, "excludes_zero": True}
    assert not Interval(-0.1, -0.3, 0.0, 10).excludes_zero
    assert Interval(-0.1, -0.3, -0.01, 10).excludes_zero


def test_ratio_interval_is_the_ratio_of_means_with_a_joint_resample() -> None:
    numerator = {("nq", str(i)): v for i, v in enumerate([1.0, 0.0, 1.0, 0.0])}
    denominator = {("nq", str(i)): 1.0 for i in range(4)}
    found = ratio_interval(numerator, denominator, resamples=500)
    assert found.estimate == pytest.approx(0.5) and found.n == 4
    assert 0.0 <= found.low < 0.5 < found.high <= 1.0
    # Numerator equal to the denominator on every question: the ratio is 1 on every resample.
    same = ratio_interval(numerator, numerator, resamples=500)
    assert (same.estimate, same.low, same.high) == (1.0, 1.0, 1.0)


def test_ratio_interval_without_questions_or_with_a_zero_denominator() -> None:
    assert ratio_interval({}, {}) is None
    assert ratio_interval({("nq", "1"): 1.0}, {("nq", "2"): 1.0}) is None  # no shared question
    assert ratio_interval({("nq", "1"): 1.0}, {("nq", "1"): 0.0}) is None
