"""The lab's statistics, one definition of each, and its CPU instruments.

Percentiles are by **linear interpolation** between the two nearest order statistics (numpy's
default, Hyndman and Fan's type 7): of n sorted values x[0..n-1], the q-th percentile sits at rank
r = (n - 1) q / 100 and is x[floor r] + (r - floor r) (x[ceil r] - x[floor r]). Every report of the
lab uses this one definition (medians included: the 50th percentile), so a p95 in one report means
what it means in another.

Intervals are percentile-bootstrap 95 % intervals, seeded, so a report rendered again from the
same records shows the same interval. The interval of a mean (and of a paired difference, the mean
of per-item differences) is the evaluation protocol's (`adaptive_rag.evaluation.bootstrap`, one
group). A ratio of two samples' statistics (after / before of a median, of a p95, of CPU per
answer) resamples each side's *blocks* on its own: a block is what varies together (the requests
of one interleaved block share its moment's machine noise; a single request is a block of one).

The CPU instruments: `CpuMeter` (CPU seconds each role's processes used between two snapshots) and
`hold_cpu_latency` (a CPU wake-up latency limit held for the length of a run).
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from adaptive_rag.evaluation.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED, Interval, bootstrap_mean

Block = TypeVar("Block")
Seed = int | np.random.Generator  # a seed, or a generator that several intervals draw from in turn
LOW, HIGH = 2.5, 97.5  # percentiles of the resampled statistics: the 95 % interval

__all__ = [
    "CpuLatencyUnavailable", "CpuMeter", "Interval", "block_bootstrap_ratio", "cpu_seconds",
    "hold_cpu_latency", "mean_interval", "median", "paired_difference_interval",
    "paired_percentile_ratio_interval", "percentile", "percentile_ranks", "percentile_ratio_interval", "percentiles", "ratio_of_medians_interval",
    "slope", "wilson_interval",
]


# --- percentiles ----------------------------------------------------------------------------------


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None for no values (None values are
    left out)."""
    data = [v for v in values if v is not None]
    if not data:
        return None
    return float(np.percentile(np.asarray(data, dtype=float), q))


def percentiles(values: Iterable[float | None], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float | None]:
    """`{"p50": ..., "p95": ..., "p99": ...}` of `values` (each None for no values)."""
    data = [v for v in values if v is not None]
    return {f"p{q:g}": percentile(data, q) for q in qs}


def median(values: Iterable[float | None]) -> float | None:
    """The 50th percentile; None for no values."""
    return percentile(values, 50)


def percentile_ranks(n: int, q: float) -> tuple[int, int]:
    """The two order statistics (0-based ranks in sorted order) the q-th percentile of n values
    interpolates between (equal when it falls on one)."""
    if n <= 0:
        raise ValueError("no values, no order statistics")
    rank = (n - 1) * q / 100
    return math.floor(rank), math.ceil(rank)


# --- intervals ------------------------------------------------------------------------------------


def mean_interval(values: Sequence[float], resamples: int = DEFAULT_RESAMPLES,
                  seed: int = DEFAULT_SEED) -> Interval | None:
    """The mean of `values` with its percentile-bootstrap 95 % interval (the evaluation protocol's
    bootstrap, one group); None with fewer than two values (one value has no spread to resample)."""
    if len(values) < 2:
        return None
    return bootstrap_mean({"all": list(values)}, resamples, seed)


def wilson_interval(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score 95 % interval of a proportion hits/n: beside the bootstrap where the
    proportion is 0 or 1 and the bootstrap interval has no width (0 false positives in 5,000 is
    not a rate of exactly 0)."""
    if n <= 0:
        raise ValueError("a proportion of no trials has no interval")
    if not 0 <= hits <= n:
        raise ValueError(f"{hits} hits out of {n} trials")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference_interval(before: Sequence[float], after: Sequence[float],
                               resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> Interval | None:
    """Mean of after[i] - before[i] over paired items, with its interval: items resampled as
    pairs, so it reflects how the two differ on the same items, not how hard the drawn items were."""
    if len(before) != len(after):
        raise ValueError(f"paired samples differ in length: {len(before)} vs {len(after)}")
    return mean_interval([a - b for b, a in zip(before, after)], resamples, seed)


def block_bootstrap_ratio(numerator: Sequence[Block], denominator: Sequence[Block],
                          statistic: Callable[[list[Block]], float], resamples: int,
                          seed: Seed = DEFAULT_SEED) -> tuple[float, float] | None:
    """95 % percentile-bootstrap interval of statistic(numerator) / statistic(denominator), each
    side's blocks resampled with replacement on its own (all of the numerator's draws first, then
    the denominator's); None when a side has fewer than two blocks."""
    if len(numerator) < 2 or len(denominator) < 2:
        return None
    rng = np.random.default_rng(seed)  # a Generator passed in is used as it is
    picks_num = rng.integers(0, len(numerator), (resamples, len(numerator)))
    picks_den = rng.integers(0, len(denominator), (resamples, len(denominator)))
    ratios = [statistic([numerator[i] for i in a]) / statistic([denominator[i] for i in b])
              for a, b in zip(picks_num, picks_den)]
    low, high = np.percentile(ratios, [LOW, HIGH])
    return float(low), float(high)


def ratio_of_medians_interval(numerator: Sequence[Sequence[float]], denominator: Sequence[Sequence[float]],
                              resamples: int, seed: Seed = DEFAULT_SEED) -> tuple[float, float] | None:
    """Interval of median(numerator) / median(denominator) over the values of resampled blocks
    (each block a list of values; empty blocks left out). Resampling values one by one where they
    come in blocks gives intervals too narrow (an A/A run of the front-door benchmark showed
    0.90x [0.86, 0.94] that way)."""
    def pooled_median(blocks: list[np.ndarray]) -> float:
        return float(np.median(np.concatenate(blocks)))

    return block_bootstrap_ratio([np.asarray(b, dtype=float) for b in numerator if len(b)],
                                 [np.asarray(b, dtype=float) for b in denominator if len(b)],
                                 pooled_median, resamples, seed)


def percentile_ratio_interval(numerator: Sequence[float], denominator: Sequence[float], q: float,
                              resamples: int, seed: Seed = DEFAULT_SEED) -> tuple[float, float] | None:
    """Interval of percentile_q(numerator) / percentile_q(denominator), each value its own block."""
    def pct(picked: list[float]) -> float:
        return float(np.percentile(picked, q))

    return block_bootstrap_ratio(list(numerator), list(denominator), pct, resamples, seed)


def paired_percentile_ratio_interval(numerator: Sequence[float], denominator: Sequence[float], q: float,
                                     resamples: int = DEFAULT_RESAMPLES, seed: Seed = DEFAULT_SEED) -> Interval | None:
    """percentile_q(numerator) / percentile_q(denominator) where numerator[i] and denominator[i]
    were measured on the same item side by side (two ways of answering one question), with its
    95 % interval: items resampled as pairs, so the interval keeps what the pairs share (the
    question's length, the machine's moment). None with fewer than two pairs."""
    if len(numerator) != len(denominator):
        raise ValueError(f"paired samples differ in length: {len(numerator)} vs {len(denominator)}")
    if len(numerator) < 2:
        return None
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(num), (resamples, len(num)))
    ratios = np.percentile(num[picks], q, axis=1) / np.percentile(den[picks], q, axis=1)
    low, high = np.percentile(ratios, [LOW, HIGH])
    estimate = float(np.percentile(num, q) / np.percentile(den, q))
    return Interval(estimate, float(low), float(high), len(num))


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x; None with fewer than three points or a single x."""
    if len(points) < 3:
        return None
    x = np.asarray([p[0] for p in points], dtype=float)
    y = np.asarray([p[1] for p in points], dtype=float)
    if float(x.std()) == 0:
        return None
    return float(np.polyfit(x, y, 1)[0])


def theil_sen(points: Sequence[tuple[float, float]], confidence: float = 0.95) -> dict[str, float] | None:
    """Robust slope of y on x with its `confidence` interval (Theil-Sen: the median of the slopes
    of every pair of points with distinct x; Sen's interval from the variance of Kendall's S,
    corrected for ties, as scipy's `theilslopes` computes it); None below 3 points or with one
    distinct x. A few outliers (a GC pause, a burst) hardly move it, unlike least squares."""
    from collections import Counter
    from statistics import NormalDist

    pts = [(float(x), float(y)) for x, y in points if x is not None and y is not None]
    if len(pts) < 3 or len({x for x, _ in pts}) < 2:
        return None
    x = np.asarray([p[0] for p in pts])
    y = np.asarray([p[1] for p in pts])
    i, j = np.triu_indices(len(pts), k=1)
    dx = x[j] - x[i]
    keep = dx != 0
    slopes = np.sort((y[j] - y[i])[keep] / dx[keep])
    med = float(np.median(slopes))
    intercept = float(np.median(y) - med * np.median(x))
    n, pairs = len(pts), len(slopes)

    def ties(values: np.ndarray) -> float:
        return float(sum(k * (k - 1) * (2 * k + 5) for k in Counter(values.tolist()).values() if k > 1))

    variance = (n * (n - 1) * (2 * n + 5) - ties(x) - ties(y)) / 18.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    spread = z * math.sqrt(max(variance, 0.0))
    low = slopes[max(int(round((pairs - spread) / 2.0)) - 1, 0)]
    high = slopes[min(int(round((pairs + spread) / 2.0)), pairs - 1)]
    return {"slope": med, "intercept": intercept, "low": float(low), "high": float(high), "n": n}


# --- the CPU: what processes used -----------------------------------------------------------------

PROC = Path("/proc")


def process_table(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid of every process."""
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _cmdline(pid: int, proc: Path = PROC) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def cpu_seconds(pids: Iterable[int], proc: Path = PROC) -> float:
    """CPU time the processes `pids` have used so far: the sum over their live threads of the
    scheduler's run time (`/proc/<pid>/task/<tid>/schedstat`, nanoseconds; `stat`'s clock ticks
    are 10 ms, too coarse for a short block). A process that is gone counts 0."""
    total = 0
    for pid in pids:
        try:
            tasks = list((proc / str(pid) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


class CpuMeter:
    """CPU seconds each role's processes used between two snapshots.

    A process has the role of its own pid in `roles`, else that of its nearest ancestor there
    (a worker pool's children are the pool's), else `name_other(its command line)`; a process
    without a role is not read."""

    def __init__(self, roles: Mapping[int, str], name_other: Callable[[str], str | None] | None = None,
                 proc: Path = PROC) -> None:
        self.roles = dict(roles)
        self.name_other = name_other
        self.proc = proc

    def role_of(self, pid: int, parents: Mapping[int, int]) -> str | None:
        seen = pid
        while seen and seen in parents:
            if seen in self.roles:
                return self.roles[seen]
            seen = parents[seen]
        return self.name_other(_cmdline(pid, self.proc)) if self.name_other else None

    def snapshot(self) -> dict[int, tuple[str, float]]:
        """pid -> (role, CPU seconds so far) of every process with a role."""
        parents = process_table(self.proc)
        out = {}
        for pid in parents:
            role = self.role_of(pid, parents)
            if role is not None:
                out[pid] = (role, cpu_seconds([pid], self.proc))
        return out

    @staticmethod
    def used(before: Mapping[int, tuple[str, float]], after: Mapping[int, tuple[str, float]]) -> dict[str, float]:
        """role -> CPU seconds between the snapshots, most first; a process started in between
        counts all its time, one gone by `after` counts none."""
        out: dict[str, float] = {}
        for pid, (role, seconds) in after.items():
            spent = seconds - (before[pid][1] if pid in before else 0.0)
            if spent > 0:
                out[role] = out.get(role, 0.0) + spent
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# --- the CPU: a wake-up latency limit held for a run ----------------------------------------------

PM_QOS = Path("/dev/cpu_dma_latency")


class CpuLatencyUnavailable(RuntimeError):
    """The limit cannot be held here (no PM QoS device, or not allowed to write it)."""


@contextlib.contextmanager
def hold_cpu_latency(microseconds: int | None, device: Path = PM_QOS) -> Iterator[int | None]:
    """Hold `microseconds` as the CPUs' wake-up latency limit inside the block; None: no limit.

    Writing a number of microseconds to `/dev/cpu_dma_latency` and keeping the file open asks the
    kernel's idle governor to use no idle state that takes longer than that to leave; 0 keeps idle
    CPUs polling instead of halting. On a virtual machine a halted vCPU is woken through the
    hypervisor, which costs every hop between processes of a lightly loaded stack far more than
    the work itself (`lab.experiments.wakeup_latency` measures it). The limit lasts while the file
    is open and is dropped when it is closed: nothing outlives the run. This is the knob tuned's
    `latency-performance` profile turns (`force_latency`); it needs root.
    """
    if microseconds is None:
        yield None
        return
    if microseconds < 0:
        raise ValueError(f"a wake-up latency limit is >= 0 microseconds, not {microseconds}")
    try:
        fd = os.open(device, os.O_WRONLY)
    except OSError as exc:
        raise CpuLatencyUnavailable(
            f"cannot hold a CPU wake-up latency limit: {device}: {exc.strerror} (Linux PM QoS; needs root)"
        ) from exc
    try:
        os.write(fd, struct.pack("i", microseconds))
        yield microseconds
    finally:
        os.close(fd)
