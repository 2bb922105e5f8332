"""Bootstrap 95 % intervals for the evaluation report: a row's mean F1 and the difference of two
rows on the same questions.

Stratified by dataset: the report's average is the mean of the dataset means (each dataset weighs
the same), so every resample redraws, within each dataset, as many questions as it has, and
averages the dataset means; for one dataset this is the ordinary bootstrap. Paired: a difference
is resampled question by question (the same draw for both rows), so it reflects only how the two
rows differ on the same questions, not how hard the drawn questions were. Seeded, so a report
regenerated from the same outcomes shows the same intervals.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
CONFIDENCE = 0.95

# (dataset, question_id) -> a per-question value (F1, a difference of F1s, 1.0 for a hit, ...)
Keyed = Mapping[tuple[str, str], float]


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval over `n` questions."""

    estimate: float
    low: float
    high: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def as_dict(self) -> dict[str, float | int | bool]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "n": self.n,
                "excludes_zero": self.excludes_zero}


def bootstrap_mean(
    values_by_group: Mapping[str, Sequence[float]],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = CONFIDENCE,
) -> Interval | None:
    """Mean over groups of each group's mean, with its stratified percentile interval (None when
    there are no values)."""
    groups = [np.asarray(values_by_group[g], dtype=float) for g in sorted(values_by_group)]
    groups = [g for g in groups if len(g)]
    if not groups:
        return None
    low, high = _percentiles(_resampled_means(groups, resamples, seed), confidence)
    estimate = float(np.mean([g.mean() for g in groups]))
    # Rounding noise only (every resample equal): an interval of constant values is the value.
    low = estimate if abs(low - estimate) < 1e-12 else float(low)
    high = estimate if abs(high - estimate) < 1e-12 else float(high)
    return Interval(estimate, low, high, sum(len(g) for g in groups))


def _resampled_means(groups: Sequence[np.ndarray], resamples: int, seed: int) -> np.ndarray:
    """Per resample, the mean over groups of each group's mean, every group redrawn with
    replacement to its own size (column by column for groups of paired values)."""
    rng = np.random.default_rng(seed)
    total = np.zeros((resamples, *groups[0].shape[1:]))
    for data in groups:
        total += data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    return total / len(groups)


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


def by_dataset(values: Keyed) -> dict[str, list[float]]:
    grouped: dict[str, list[float]] = defaultdict(list)
    for (dataset, _), value in values.items():
        grouped[dataset].append(value)
    return dict(grouped)


def mean_interval(
    values: Keyed, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> Interval | None:
    """A row's mean over datasets of per-question `values`, with its interval."""
    return bootstrap_mean(by_dataset(values), resamples, seed)


def difference_interval(
    a: Keyed, b: Keyed, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> Interval | None:
    """Mean of a - b over the questions both rows answered (paired), with its interval."""
    deltas = {key: a[key] - b[key] for key in a if key in b}
    return mean_interval(deltas, resamples, seed)


def ratio_interval(
    numerator: Keyed, denominator: Keyed, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
    confidence: float = CONFIDENCE,
) -> Interval | None:
    """The ratio of two stratified means over the questions both cover (for example a router's
    gain over the best fixed strategy divided by the oracle's: the share of the gap it closes),
    resampled jointly, question by question. None without questions or when the denominator's
    mean is 0; resamples whose denominator is 0 are dropped."""
    keys = sorted(k for k in numerator if k in denominator)
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for key in keys:
        groups[key[0]].append((numerator[key], denominator[key]))
    if not groups:
        return None
    pairs = [np.asarray(groups[g], dtype=float) for g in sorted(groups)]
    estimate_den = float(np.mean([p[:, 1].mean() for p in pairs]))
    if estimate_den == 0:
        return None
    estimate = float(np.mean([p[:, 0].mean() for p in pairs])) / estimate_den
    means = _resampled_means(pairs, resamples, seed)  # (resamples, 2): numerator, denominator
    kept = means[:, 1] != 0
    low, high = _percentiles(means[kept, 0] / means[kept, 1], confidence)
    return Interval(estimate, low, high, len(keys))
