"""Capacity planning for the tier worker pools: an M/M/c (Erlang C) queue per tier.

Model (one per tier, independent of the other tiers). Queries of the tier arrive as a Poisson
stream of rate ``lam`` (queries/s); ``c`` identical workers each serve one task at a time with
exponentially distributed service times of mean ``s`` (``mu = 1/s``); one FIFO queue per tier.
With the offered load ``a = lam/mu`` and the utilization ``rho = a/c`` (< 1 for a steady state),
Gross & Harris, *Fundamentals of Queueing Theory* (4th ed., 2008), section 2.3 (M/M/c), give:

- Erlang C, the probability that an arriving task waits::

      C(c, a) = [a^c / c! * c/(c - a)] / [sum_{k<c} a^k/k! + a^c / c! * c/(c - a)]

  computed here through the stable Erlang B recursion ``B(0) = 1``,
  ``B(k) = a B(k-1) / (k + a B(k-1))``, ``C = c B(c) / (c - a (1 - B(c)))``;
- the queue wait ``Wq``: ``P(Wq > t) = C(c, a) exp(-(c mu - lam) t)``, so
  ``E[Wq] = C / (c mu - lam)``, ``Lq = lam E[Wq]`` (Little) and the p95 wait is
  ``ln(C / 0.05) / (c mu - lam)`` when ``C > 0.05``, else 0;
- the time in system ``T = Wq + S`` (FIFO: the own service ``S ~ Exp(mu)`` is independent of the
  wait). ``Wq`` is 0 with probability ``1 - C`` and ``Exp(theta)``, ``theta = c mu - lam``, with
  probability ``C``, so ``T`` is a mix of ``Exp(mu)`` and the hypoexponential ``Exp(theta) +
  Exp(mu)``; its tail (G&H's M/M/c waiting-time distribution of the time in system)::

      P(T > t) = exp(-mu t) + C mu (exp(-mu t) - exp(-theta t)) / (theta - mu)
               = exp(-mu t) [1 + C (1 - exp(-mu (c - 1 - a) t)) / (c - 1 - a)]

  (limit ``exp(-mu t) (1 + C mu t)`` when ``theta = mu``). The p95 of ``T`` is the root of
  ``P(T > t) = 0.05``, found by bisection (the tail decreases strictly in ``t``).

Since ``T >= S``, no number of workers gets the p95 of ``T`` below the p95 of the service time
alone, ``s ln 20`` (about ``3.0 s``): a smaller target is unreachable. Both ``C`` and ``P(T > t)``
decrease in ``c``, so the smallest ``c`` meeting both constraints is found by a monotone search.

Queue-length target for an autoscaler (KEDA's Redis scaler on the tier's list): a task that finds
``n`` tasks queued ahead of it with every worker busy waits about ``n / (c mu)`` (tasks ahead of
you / service rate = your wait; exactly ``(n + 1) / (c mu)`` on average, counting the departure
that frees a worker). The wait budget is the p95 target minus the mean service time, so the queue
must stay at or below ``floor(c mu (S_p95 - s))``. KEDA's ``listLength`` is a target *per
replica* (desired replicas = ceil(LLEN / listLength)), so a replica running ``k`` worker processes
gets ``floor(k mu (S_p95 - s))``, independent of how many replicas run.

Pure functions and frozen dataclasses, no I/O (`parse_service_time_report` takes parsed JSON).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from adaptive_rag.contracts import TIERS
from adaptive_rag.errors import AdaptiveRagError

PERCENTILE = 0.95
TAIL = 1.0 - PERCENTILE  # 0.05
MIX_TOLERANCE = 1e-6
LN20 = math.log(1.0 / TAIL)  # the p95 of Exp(1): ln 20 ~ 2.9957


class CapacityError(AdaptiveRagError, ValueError):
    """Inputs of the capacity planner are unusable (the message says which and why)."""


class UnreachableTargetError(CapacityError):
    """A p95 target lies at or below the smallest p95 any number of workers can achieve."""


# --- M/M/c formulas -------------------------------------------------------------------------------


def _check_queue(lam: float, mu: float, c: int) -> float:
    """The offered load ``a = lam/mu`` after checking the arguments describe a stable queue."""
    if not (lam > 0 and math.isfinite(lam)):
        raise CapacityError(f"arrival rate must be positive and finite, got {lam}")
    if not (mu > 0 and math.isfinite(mu)):
        raise CapacityError(f"service rate must be positive and finite, got {mu}")
    if c < 1:
        raise CapacityError(f"number of workers must be at least 1, got {c}")
    a = lam / mu
    if a >= c:
        raise CapacityError(f"unstable queue: offered load {a:.6g} >= {c} workers (utilization >= 1)")
    return a


def erlang_b(c: int, a: float) -> float:
    """Erlang B blocking probability ``B(c, a)`` by the recursion ``B(k) = a B(k-1)/(k + a B(k-1))``."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def erlang_c(c: int, a: float) -> float:
    """Erlang C: probability that an arriving task waits in M/M/c with offered load ``a < c``."""
    if a <= 0:
        return 0.0
    if a >= c:
        return 1.0
    b = erlang_b(c, a)
    return c * b / (c - a * (1.0 - b))


def wait_tail(t: float, lam: float, mu: float, c: int) -> float:
    """``P(Wq > t) = C(c, a) exp(-(c mu - lam) t)`` for ``t >= 0``."""
    a = _check_queue(lam, mu, c)
    return erlang_c(c, a) * math.exp(-(c * mu - lam) * max(t, 0.0))


def response_tail(t: float, lam: float, mu: float, c: int) -> float:
    """``P(T > t)`` of the time in system ``T = Wq + S`` (see the module docstring).

    Written as ``exp(-mu t) + C mu exp(-min(mu, theta) t) (1 - exp(-|theta - mu| t)) / |theta - mu|``,
    which is exact and free of cancellation for every sign of ``theta - mu`` (``theta = c mu - lam``).
    """
    a = _check_queue(lam, mu, c)
    if t <= 0:
        return 1.0
    cw = erlang_c(c, a)
    theta = c * mu - lam
    d = abs(theta - mu)
    spread = t if d == 0 else -math.expm1(-d * t) / d  # (1 - e^{-d t}) / d, -> t as d -> 0
    return math.exp(-mu * t) + cw * mu * math.exp(-min(mu, theta) * t) * spread


def _bisect_tail(tail: Callable[[float], float], lo: float, hi: float, level: float = TAIL) -> float:
    """The ``t`` in ``[lo, hi]`` with ``tail(t) = level`` for a decreasing ``tail``."""
    while tail(hi) > level:  # widen until the root is bracketed
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if tail(mid) > level:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def response_percentile(lam: float, mu: float, c: int, q: float = PERCENTILE) -> float:
    """The ``q`` quantile of the time in system (default p95), by bisection on ``P(T > t) = 1 - q``."""
    _check_queue(lam, mu, c)
    level = 1.0 - q
    lo = math.log(1.0 / level) / mu  # T >= S, so the quantile is at least the service quantile
    return _bisect_tail(lambda t: response_tail(t, lam, mu, c), lo, 2.0 * lo + wait_percentile(lam, mu, c, q), level)


def wait_percentile(lam: float, mu: float, c: int, q: float = PERCENTILE) -> float:
    """The ``q`` quantile of the queue wait: ``ln(C / (1 - q)) / (c mu - lam)``, 0 when ``C <= 1 - q``."""
    a = _check_queue(lam, mu, c)
    cw = erlang_c(c, a)
    level = 1.0 - q
    return 0.0 if cw <= level else math.log(cw / level) / (c * mu - lam)


def queue_length_target(c: int, mu: float, wait_budget: float) -> int:
    """``floor(c mu W)``: the queue length at which a newly arriving task's wait reaches ``W``."""
    if wait_budget <= 0:
        return 0
    return math.floor(c * mu * wait_budget + 1e-9)  # 1e-9: 2.0000000001 products stay 2


# --- the planner ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TierPlan:
    """The smallest worker count of one tier and what the M/M/c model predicts with it."""

    tier: str
    arrival_rate: float  # lam, queries/s
    service_time_s: float  # s = 1/mu, mean seconds per task of one worker
    p95_target_s: float  # target p95 of the time in system
    workers: int  # c
    offered_load: float  # a = lam s (busy workers on average)
    utilization: float  # rho = a / c
    prob_wait: float  # Erlang C
    lq: float  # mean queue length
    wq_mean_s: float
    wq_p95_s: float
    response_mean_s: float  # Wq + s
    response_p95_s: float
    wait_budget_s: float  # p95 target - s
    queue_length_target: int  # floor(c mu wait_budget), the whole tier's queue
    list_length_per_worker: int  # floor(mu wait_budget): KEDA listLength of a 1-process replica
    binding: Literal["utilization", "p95"]  # which constraint set the worker count


def evaluate_tier(
    tier: str, arrival_rate: float, service_time_s: float, workers: int, p95_target_s: float,
) -> TierPlan:
    """The model's numbers for ``workers`` workers (no search); `binding` is left as "p95"."""
    lam, mu, c = arrival_rate, 1.0 / service_time_s, workers
    a = _check_queue(lam, mu, c)
    cw = erlang_c(c, a)
    wq = cw / (c * mu - lam)
    budget = p95_target_s - service_time_s
    return TierPlan(
        tier=tier, arrival_rate=lam, service_time_s=service_time_s, p95_target_s=p95_target_s,
        workers=c, offered_load=a, utilization=a / c, prob_wait=cw, lq=lam * wq, wq_mean_s=wq,
        wq_p95_s=wait_percentile(lam, mu, c), response_mean_s=wq + service_time_s,
        response_p95_s=response_percentile(lam, mu, c), wait_budget_s=budget,
        queue_length_target=queue_length_target(c, mu, budget),
        list_length_per_worker=queue_length_target(1, mu, budget), binding="p95",
    )


def min_achievable_p95(service_time_s: float) -> float:
    """The p95 of the service time alone, ``s ln 20``: the infimum over ``c`` of the response p95."""
    return service_time_s * LN20


def plan_tier(
    tier: str, arrival_rate: float, service_time_s: float, p95_target_s: float,
    max_utilization: float = 0.8,
) -> TierPlan:
    """The smallest ``c`` with ``lam s / c <= max_utilization`` and response p95 ``<= p95_target_s``.

    Raises `UnreachableTargetError` when ``p95_target_s <= s ln 20`` (no ``c`` reaches it).
    """
    _check_positive(f"tier {tier} arrival rate", arrival_rate)
    _check_positive(f"tier {tier} service time", service_time_s)
    _check_positive(f"tier {tier} p95 target", p95_target_s)
    if not 0 < max_utilization <= 1:
        raise CapacityError(f"max utilization must be in (0, 1], got {max_utilization}")
    floor_p95 = min_achievable_p95(service_time_s)
    if p95_target_s <= floor_p95:
        raise UnreachableTargetError(
            f"tier {tier}: p95 target {p95_target_s:g} s is unreachable: with exponential service of "
            f"mean {service_time_s:g} s the service time alone has p95 {floor_p95:.3f} s "
            f"(= {service_time_s:g} s x ln 20), so the smallest achievable p95 is just above "
            f"{floor_p95:.3f} s however many workers run; raise the target above it or cut the "
            f"service time"
        )
    lam, mu = arrival_rate, 1.0 / service_time_s
    a = lam * service_time_s
    # utilization: a / c <= u  <=>  c >= a / u; stability needs c > a (strictly)
    c_util = max(1, math.ceil(a / max_utilization - 1e-12))
    if c_util <= a:
        c_util = math.floor(a) + 1

    def meets(c: int) -> bool:
        return response_percentile(lam, mu, c) <= p95_target_s

    if meets(c_util):
        return _with_binding(evaluate_tier(tier, lam, service_time_s, c_util, p95_target_s), "utilization")
    lo, step = c_util, 1  # meets(lo) is False; gallop up, then bisect (p95 decreases in c)
    hi = lo + step
    while not meets(hi):
        lo, step = hi, step * 2
        hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return _with_binding(evaluate_tier(tier, lam, service_time_s, hi, p95_target_s), "p95")


def _with_binding(plan: TierPlan, binding: Literal["utilization", "p95"]) -> TierPlan:
    return TierPlan(**{**asdict(plan), "binding": binding})


@dataclass(frozen=True)
class CapacityPlan:
    """Worker counts for every tier of the mix at a total arrival rate."""

    rate: float
    max_utilization: float
    tiers: tuple[TierPlan, ...]

    @property
    def total_workers(self) -> int:
        return sum(t.workers for t in self.tiers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": "M/M/c (Erlang C) per tier: Poisson arrivals, exponential service, FIFO, "
                     "one task per worker at a time",
            "rate": self.rate, "max_utilization": self.max_utilization,
            "total_workers": self.total_workers,
            "tiers": [asdict(t) for t in self.tiers],
        }


def plan_capacity(
    rate: float, mix: Mapping[str, float], service_times: Mapping[str, float],
    p95_target: float | Mapping[str, float], max_utilization: float = 0.8,
) -> CapacityPlan:
    """Plan every tier of ``mix`` (shares summing to 1 within 1e-6) at a total of ``rate`` queries/s.

    ``p95_target`` is one number for all tiers or one per tier. Every unreachable tier is named in
    one `UnreachableTargetError`.
    """
    _check_positive("rate", rate)
    mix = validate_mix(mix)
    targets = {t: float(p95_target) for t in mix} if isinstance(p95_target, (int, float)) else dict(p95_target)
    for name, values in (("service time", service_times), ("p95 target", targets)):
        _check_tiers(name, values)
        missing = [t for t in mix if t not in values]
        if missing:
            raise CapacityError(f"no {name} for tier(s) {', '.join(missing)} of the mix")
    plans: list[TierPlan] = []
    unreachable: list[str] = []
    for tier in (t.value for t in TIERS):
        if tier not in mix:
            continue
        try:
            plans.append(plan_tier(tier, rate * mix[tier], float(service_times[tier]),
                                   float(targets[tier]), max_utilization))
        except UnreachableTargetError as exc:
            unreachable.append(str(exc))
    if unreachable:
        raise UnreachableTargetError("; ".join(unreachable))
    return CapacityPlan(rate=rate, max_utilization=max_utilization, tiers=tuple(plans))


# --- inputs ---------------------------------------------------------------------------------------


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise CapacityError(f"{name} must be a positive number, got {value!r}")


def _check_tiers(name: str, values: Mapping[str, object]) -> None:
    unknown = sorted(set(values) - {t.value for t in TIERS})
    if unknown:
        raise CapacityError(
            f"unknown tier(s) {', '.join(map(repr, unknown))} in {name}; the tiers are "
            f"{', '.join(t.value for t in TIERS)}"
        )


def validate_mix(mix: Mapping[str, float]) -> dict[str, float]:
    """The mix checked: known tiers, positive shares summing to 1 within `MIX_TOLERANCE` (no
    silent normalisation: a mix that does not add up is more likely a typo than an intent)."""
    if not mix:
        raise CapacityError("the mix is empty; give shares such as A=0.6,B=0.3,C=0.1")
    _check_tiers("mix", mix)
    for tier, share in mix.items():
        _check_positive(f"mix share of tier {tier}", share)
    total = math.fsum(mix.values())
    if abs(total - 1.0) > MIX_TOLERANCE:
        raise CapacityError(
            f"mix shares sum to {total:.6g}, not 1 (tolerance {MIX_TOLERANCE:g}); leave a tier out "
            f"if it gets no traffic"
        )
    return {t.value: float(mix[t.value]) for t in TIERS if t.value in mix}


def parse_tier_values(text: str, what: str) -> dict[str, float]:
    """``"A=0.6,B=0.3,C=0.1"`` as ``{"A": 0.6, ...}`` (tier letters case-insensitive)."""
    values: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, raw = part.partition("=")
        if not sep:
            raise CapacityError(f"{what}: expected TIER=VALUE, got {part!r}")
        tier = name.strip().upper()
        if tier in values:
            raise CapacityError(f"{what}: tier {tier} given twice")
        try:
            values[tier] = float(raw)
        except ValueError:
            raise CapacityError(f"{what}: {raw.strip()!r} for tier {tier} is not a number") from None
    if not values:
        raise CapacityError(f"{what}: no values given (expected A=..,B=..,C=..)")
    _check_tiers(what, values)
    for tier, value in values.items():
        _check_positive(f"{what} of tier {tier}", value)
    return values


def parse_service_time_report(report: object) -> dict[str, float]:
    """Mean service times per tier from a load-run report (parsed JSON).

    Schema (the load run writes it; extra keys are ignored)::

        {"service_time_s": {"A": 0.15, "B": 1.8, "C": 4.5}}
        {"per_tier": {"A": {"service_time_s": 0.15, ...}, ...}}   # also accepted

    Tier keys are case-insensitive; keys that are not tiers (e.g. "shadow") and null values are
    skipped; the top-level ``service_time_s`` wins over ``per_tier`` where both name a tier.
    """
    if not isinstance(report, dict):
        raise CapacityError("service-time report: expected a JSON object")
    tiers = {t.value for t in TIERS}
    found: dict[str, float] = {}
    per_tier = report.get("per_tier")
    if isinstance(per_tier, dict):
        for key, entry in per_tier.items():
            if str(key).upper() in tiers and isinstance(entry, dict) and entry.get("service_time_s") is not None:
                found[str(key).upper()] = entry["service_time_s"]
    top = report.get("service_time_s")
    if isinstance(top, dict):
        for key, value in top.items():
            if str(key).upper() in tiers and value is not None:
                found[str(key).upper()] = value
    if not found:
        raise CapacityError(
            'service-time report has no service times: expected {"service_time_s": {"A": .., "B": .., '
            '"C": ..}} or {"per_tier": {"A": {"service_time_s": ..}, ..}}'
        )
    for tier, value in found.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CapacityError(f"service-time report: tier {tier} service_time_s is not a number: {value!r}")
        _check_positive(f"service time of tier {tier} in the report", value)
    return {t.value: float(found[t.value]) for t in TIERS if t.value in found}


__all__ = [
    "CapacityError", "CapacityPlan", "TierPlan", "UnreachableTargetError", "erlang_b", "erlang_c",
    "evaluate_tier", "min_achievable_p95", "parse_service_time_report", "parse_tier_values",
    "plan_capacity", "plan_tier", "queue_length_target", "response_percentile", "response_tail",
    "validate_mix", "wait_percentile", "wait_tail",
]
