"""A price on time for a router's probabilities, chosen on `train` labels to hold a time budget.

Why: a router's own decision buys the most F1 it can, whatever it costs (the shipped router sends
about 70 % of always C's time). A deployment that must answer within a share of that needs the
router to send a question to a dearer tier only when it is that much surer of it. The policy
does this with one number (`routing.policy`): the probabilities are shifted by `-price x cost`
per tier in log space, each tier's cost its mean time as a share of C's, before the usual rules.

The price is chosen out of fold over the labels that carry every tier's outcome (F1 and seconds):
each hash fold is routed by a router fitted on every other label (the binary labels included),
so no question is routed by a router that saw its label. Among the prices whose routed time is
within the budget (routed seconds over always C's, pooled), the one with the highest mean F1;
ties go to the cheaper routes, then the larger price. Over budget at every price: the cheapest.
The costs are measured on the same labels (mean seconds per tier over mean C seconds).

With a `confidence` (e.g. 0.95) the budget must hold on the upper end of the routed share's
bootstrap interval over the labels, not on its estimate: a budget is a promise about traffic the
router has not seen, and a few hundred labels estimate the share only to a point or two.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adaptive_rag.contracts import TIER_VALUES
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evaluation.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED
from adaptive_rag.routing.policy import PolicyThresholds, RoutingPolicy
from adaptive_rag.training.learned_routers import LabelledQuery
from adaptive_rag.training.splits import question_fraction

PRICES = tuple(round(0.25 * i, 2) for i in range(41))  # 0 .. 10 log-probability per C's time
FOLDS = 5
FOLD_SALT = "time-price-folds"
TIE = 1e-9

# fit(labels) -> probabilities(questions) [n, 3] in A, B, C order
Prober = Callable[[Sequence[LabelledQuery]], Callable[[Sequence[str]], np.ndarray]]


@dataclass(frozen=True)
class TimeBudget:
    """A routed-time budget: a share of always C's time, held on its out-of-fold estimate or, with
    `confidence`, on the upper end of its bootstrap interval."""

    share: float
    confidence: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.share:
            raise ConfigurationError(f"the time budget is a positive share of always C's time, not {self.share!r}")
        if self.confidence is not None and not 0.5 <= self.confidence < 1.0:
            raise ConfigurationError(f"the budget's confidence is in [0.5, 1), not {self.confidence!r}")

    def describe(self) -> str:
        held = "" if self.confidence is None else f" with {self.confidence:.0%} confidence"
        return f"{self.share:.0%} of always C's time{held}"


@dataclass(frozen=True)
class TimePriceChoice:
    """The chosen price with what it did out of fold, and the whole price grid."""

    budget: float
    price: float
    tier_costs: tuple[float, float, float]
    within_budget: bool
    n: int
    folds: int
    f1: float
    always_b_f1: float
    always_c_f1: float
    time_share_of_c: float
    routed: dict[str, int]
    grid: list[dict[str, float]] = field(default_factory=list)
    confidence: float | None = None
    time_share_upper: float | None = None

    def card(self) -> dict[str, Any]:
        """The record kept in the router's card (JSON)."""
        held = ("its estimate" if self.confidence is None else
                f"the upper end of its {self.confidence:.0%} bootstrap interval ({DEFAULT_RESAMPLES} draws of the labels)")
        oof: dict[str, Any] = {"n": self.n, "f1": round(self.f1, 6), "always_b_f1": round(self.always_b_f1, 6),
                               "always_c_f1": round(self.always_c_f1, 6),
                               "time_share_of_c": round(self.time_share_of_c, 6), "routed": self.routed}
        if self.time_share_upper is not None:
            oof["time_share_upper"] = round(self.time_share_upper, 6)
        return {
            "budget": self.budget, "confidence": self.confidence, "price": self.price,
            "tier_costs": [round(c, 6) for c in self.tier_costs], "within_budget": self.within_budget,
            "selection": (f"out of fold ({self.folds} hash folds of the {self.n} labels with every tier's F1 and "
                          "seconds): the price with the highest mean F1 whose routed time (share of always C's, "
                          f"{held}) is within the budget; ties: cheaper, then larger price"),
            "out_of_fold": oof,
            "grid": [{k: round(v, 6) for k, v in g.items()} for g in self.grid],
        }


def priced_thresholds(rules: PolicyThresholds, card: Mapping[str, Any]) -> PolicyThresholds:
    """`rules` with the price on time a router's card holds (`TimePriceChoice.card`), its budget
    recorded in the metrics (what `arag retrain` prices a challenger for again)."""
    oof = card["out_of_fold"]
    budget = TimeBudget(float(card["budget"]), card.get("confidence"))
    held = {} if budget.confidence is None else {"time_budget_confidence": budget.confidence}
    return PolicyThresholds(
        c_threshold=rules.c_threshold, a_threshold=rules.a_threshold,
        note=f"{rules.note}; time priced at {card['price']:g} to stay within {budget.describe()} "
             f"(chosen out of fold on {oof['n']} `train` labels)",
        metrics={**rules.metrics, "time_budget": budget.share, **held, "out_of_fold_f1": oof["f1"],
                 "out_of_fold_time_share_of_c": oof["time_share_of_c"]},
        time_price=float(card["price"]), tier_costs=tuple(card["tier_costs"]))  # type: ignore[arg-type]


def timed(examples: Iterable[LabelledQuery]) -> list[LabelledQuery]:
    """The labels a price can be judged on: every tier's F1 and seconds stored."""
    return [e for e in examples if e.has_rewards("seconds")
            and all(e.outcomes[t].f1 is not None for t in TIER_VALUES)]


def _per_tier(examples: Sequence[LabelledQuery], field_name: str) -> np.ndarray:
    """[n, 3]: each tier's stored `f1` or `seconds` per example, A, B, C order."""
    return np.array([[float(getattr(e.outcomes[t], field_name)) for t in TIER_VALUES] for e in examples])


def tier_costs(examples: Sequence[LabelledQuery]) -> tuple[float, float, float]:
    """Mean seconds per tier over the mean C seconds (C is 1)."""
    return _costs(_per_tier(examples, "seconds"))


def _costs(seconds: np.ndarray) -> tuple[float, float, float]:
    c_mean = float(seconds[:, TIER_VALUES.index("C")].mean())
    if not c_mean > 0.0:
        raise ConfigurationError("the labels' C outcomes record no time: no cost to price")
    a, b, c = (float(v) / c_mean for v in seconds.mean(axis=0))
    return a, b, c


def out_of_fold_probabilities(examples: Sequence[LabelledQuery], fit: Prober,
                              folds: int = FOLDS) -> tuple[list[LabelledQuery], np.ndarray]:
    """The timed labels and their probabilities, each from a router fitted on every other label."""
    judged = timed(examples)
    if not judged:
        raise ConfigurationError("no label carries every tier's F1 and seconds (run `arag label`): no price "
                                 "can be chosen")
    fold_of = [int(question_fraction(e.question, FOLD_SALT) * folds) for e in judged]
    fold_by_identity = {id(e): k for e, k in zip(judged, fold_of)}  # labels without outcomes: in no fold
    found = np.zeros((len(judged), len(TIER_VALUES)))
    for k in range(folds):
        held = [i for i, f in enumerate(fold_of) if f == k]
        if not held:
            continue
        part = [e for e in examples if fold_by_identity.get(id(e)) != k]
        found[held] = fit(part)([judged[i].question for i in held])
    return judged, found


def _draws(n: int) -> np.ndarray:
    """[resamples, n]: how often each label is drawn in each bootstrap resample (seeded)."""
    picks = np.random.default_rng(DEFAULT_SEED).integers(0, n, size=(DEFAULT_RESAMPLES, n))
    return np.stack([np.bincount(row, minlength=n) for row in picks]).astype(float)


def choose_price(judged: Sequence[LabelledQuery], probabilities: np.ndarray, budget: float,
                 prices: Sequence[float] = PRICES, folds: int = FOLDS,
                 confidence: float | None = None) -> TimePriceChoice:
    """The price for `budget` (a share of always C's time) by the rule in the module docstring,
    over the router's own argmax; with `confidence`, held on the share's upper bound."""
    held = TimeBudget(budget, confidence)
    f1, seconds = _per_tier(judged, "f1"), _per_tier(judged, "seconds")
    costs = _costs(seconds)
    rows = np.arange(len(judged))
    always_c_seconds = float(seconds[:, 2].sum())
    draws = _draws(len(judged)) if confidence is not None else None
    always_c_drawn = draws @ seconds[:, 2] if draws is not None else None
    grid, routes = [], {}
    for price in prices:
        policy = RoutingPolicy(PolicyThresholds(c_threshold=None, a_threshold=None,
                                                time_price=float(price), tier_costs=costs))
        chosen = np.array([TIER_VALUES.index(policy.tier(list(map(float, p)))[0].value) for p in probabilities])
        routes[price] = chosen
        point = {"price": float(price), "f1": float(f1[rows, chosen].mean()),
                 "time_share_of_c": float(seconds[rows, chosen].sum()) / always_c_seconds}
        if draws is not None:
            shares = (draws @ seconds[rows, chosen]) / always_c_drawn
            point["time_share_upper"] = float(np.quantile(shares, confidence))
        grid.append(point)
    bound = "time_share_of_c" if confidence is None else "time_share_upper"
    kept = [g for g in grid if g[bound] <= held.share + TIE]
    best = (max(kept, key=lambda g: (round(g["f1"], 9), -round(g["time_share_of_c"], 9), g["price"])) if kept
            else min(grid, key=lambda g: (g["time_share_of_c"], -g["price"])))
    counts = Counter(TIER_VALUES[i] for i in routes[best["price"]])
    return TimePriceChoice(
        budget=budget, price=best["price"], tier_costs=costs, within_budget=bool(kept), n=len(judged),
        folds=folds, f1=best["f1"], always_b_f1=float(f1[:, 1].mean()), always_c_f1=float(f1[:, 2].mean()),
        time_share_of_c=best["time_share_of_c"], routed={t: counts.get(t, 0) for t in TIER_VALUES}, grid=grid,
        confidence=confidence, time_share_upper=best.get("time_share_upper"))


def choose_time_price(examples: Sequence[LabelledQuery], budget: float, fit: Prober,
                      folds: int = FOLDS, confidence: float | None = None) -> TimePriceChoice:
    """Out-of-fold probabilities, then the price for `budget` (held with `confidence` if given)."""
    TimeBudget(budget, confidence)  # refuse a bad budget before fitting a router per fold
    judged, probabilities = out_of_fold_probabilities(examples, fit, folds)
    return choose_price(judged, probabilities, budget, folds=folds, confidence=confidence)
