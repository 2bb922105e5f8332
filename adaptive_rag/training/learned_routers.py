"""Fitting the learned routers (`adaptive_rag.routers.learned`) on labelled queries.

Each router is trained only on `train` labels (the `training_labels` table: `arag label`, and live
labels from `arag relabel`), with every hyper-parameter chosen on a validation split carved from
those labels by a stable hash of the normalised question (`validation_split`: duplicates and
paraphrases that normalise alike land on the same side), then refitted on all of them. Fitting
needs scikit-learn (the `train` extras); the fitted router is the serving class itself, so it
routes, saves and loads as `adaptive_rag.routers.learned` does.

`LogisticRouter`, `KnnRouter` and `RewardRouter` here are those routers with their fitting:
`fit(examples)` chooses hyper-parameters and refits; `KnnRouter.extend` adds live labelled queries
to the memory without refitting.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from adaptive_rag.contracts import TIER_VALUES, Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routers import learned
from adaptive_rag.routers.embeddings import Embedder
from adaptive_rag.routers.learned import FORMAT, TIE, cheapest_best, unit
from adaptive_rag.training.splits import VALIDATION_SHARE, question_fraction, validation_part

if TYPE_CHECKING:
    from adaptive_rag.storage.models import TrainingLabel

DEFAULT_VAL_SHARE = VALIDATION_SHARE


# --- labelled queries and the validation split ---------------------------------------------------


@dataclass(frozen=True)
class TierOutcome:
    """What one tier's strategy did for a question (None: not known, e.g. a live label)."""

    f1: float | None = None
    correct: bool | None = None
    steps: float | None = None
    seconds: float | None = None  # the strategy's wall time for the question, as recorded


@dataclass(frozen=True)
class LabelledQuery:
    """A question with its tier label and, when known, every tier's outcome."""

    question: str
    label: Tier
    dataset: str = ""
    question_id: str = ""
    origin: str = "benchmark"  # benchmark | live
    source: str = ""  # silver | binary | feedback | shadow
    outcomes: Mapping[str, TierOutcome] = field(default_factory=dict)

    def has_rewards(self, cost: str = "steps") -> bool:
        """Every tier's F1 (or correctness) and its cost (`steps` or `seconds`) are known: usable
        by the reward router."""
        return all(
            (o := self.outcomes.get(t)) is not None and getattr(o, cost) is not None
            and (o.f1 is not None or o.correct is not None)
            for t in TIER_VALUES
        )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def examples_from_labels(rows: Iterable[TrainingLabel]) -> list[LabelledQuery]:
    """`training_labels` rows (benchmark and live alike) as labelled queries with their outcomes."""
    found = []
    for row in rows:
        outcomes = {
            tier: TierOutcome(
                f1=_float(o.get("f1")),
                correct=None if o.get("correct") is None else bool(o["correct"]),
                steps=_float(o.get("steps")),
                seconds=_float(o.get("seconds")),
            )
            for tier, o in (row.outcomes or {}).items() if tier in TIER_VALUES and isinstance(o, Mapping)
        }
        found.append(LabelledQuery(row.question, Tier(row.label), row.dataset, row.question_id,
                                   row.origin, row.label_source, outcomes))
    return found


def in_validation(question: str, share: float = DEFAULT_VAL_SHARE) -> bool:
    """The one validation split of `train` (`training.splits.validation_part`, a hash of the
    normalised question), shared with classifier promotion: stable on any machine."""
    return validation_part(question, share) == "validation"


def validation_split(
    examples: Sequence[LabelledQuery], share: float = DEFAULT_VAL_SHARE,
) -> tuple[list[int], list[int]]:
    """Indexes of the fitting part and of the validation part."""
    fit_part, validation = [], []
    for index, example in enumerate(examples):
        (validation if in_validation(example.question, share) else fit_part).append(index)
    return fit_part, validation


def label_counts(examples: Iterable[LabelledQuery]) -> dict[str, int]:
    counts = Counter(e.label.value for e in examples)
    return {t: counts.get(t, 0) for t in TIER_VALUES}


# --- scores --------------------------------------------------------------------------------------


def label_scores(truth: Sequence[str], predicted: Sequence[str]) -> dict[str, Any]:
    """Accuracy, macro-F1 over the classes present in `truth`, per-class recall."""
    n = len(truth)
    if not n:
        return {"n": 0}
    present = [t for t in TIER_VALUES if t in set(truth)]
    f1s, recall = [], {}
    for tier in present:
        tp = sum(1 for a, b in zip(truth, predicted) if a == b == tier)
        support = sum(1 for a in truth if a == tier)
        chosen = sum(1 for b in predicted if b == tier)
        precision = tp / chosen if chosen else 0.0
        recall[tier] = tp / support
        f1s.append(2 * precision * recall[tier] / (precision + recall[tier]) if tp else 0.0)
    return {"n": n, "accuracy": sum(a == b for a, b in zip(truth, predicted)) / n,
            "macro_f1": sum(f1s) / len(f1s), "recall": recall}


def routed_quality(examples: Sequence[LabelledQuery], tiers: Sequence[str]) -> dict[str, float] | None:
    """Mean stored F1 and steps of the routed tiers, over the examples whose outcomes hold them;
    their mean seconds too when every one of those outcomes recorded its time."""
    f1 = steps = seconds = 0.0
    n = timed = 0
    for example, tier in zip(examples, tiers):
        outcome = example.outcomes.get(tier)
        if outcome is None or outcome.f1 is None or outcome.steps is None:
            continue
        f1, steps, n = f1 + outcome.f1, steps + outcome.steps, n + 1
        if outcome.seconds is not None:
            seconds, timed = seconds + outcome.seconds, timed + 1
    if not n:
        return None
    found = {"f1": f1 / n, "steps": steps / n, "n": n}
    if timed == n:
        found["seconds"] = seconds / n
    return found


def validation_report(examples: Sequence[LabelledQuery], predicted: Sequence[str]) -> dict[str, Any]:
    """Label agreement and, where outcomes are stored, the routed F1 and steps beside always-B's
    and the labels' own (the cheapest correct tier) on the same questions; where their times are
    stored too, the routed time as a share of always C's (`time_share_of_c`)."""
    report: dict[str, Any] = label_scores([e.label.value for e in examples], list(predicted))
    quality = routed_quality(examples, predicted)
    if quality is not None:
        report["routed"] = quality
        report["always_b"] = routed_quality(examples, ["B"] * len(examples))
        report["labels"] = routed_quality(examples, [e.label.value for e in examples])
        always_c = routed_quality(examples, ["C"] * len(examples))
        if always_c and always_c["n"] == quality["n"] and "seconds" in quality and always_c.get("seconds"):
            report["always_c"] = always_c
            report["time_share_of_c"] = quality["seconds"] / always_c["seconds"]
    return report


def _software() -> dict[str, str]:
    found = {"numpy": np.__version__}
    try:
        import sklearn

        found["scikit-learn"] = sklearn.__version__
    except ImportError:  # pragma: no cover - routing needs no sklearn
        pass
    return found



# --- fitting ---------------------------------------------------------------------------------------


class LearnedRouterFitting(learned.LearnedRouter):
    """What fitting adds to a learned router: the usable examples, the hyper-parameter search on
    the hash validation split, and the final refit."""

    selection_rule: str

    def __init__(self, embedder: Embedder | None = None, val_share: float = DEFAULT_VAL_SHARE) -> None:
        super().__init__(embedder)
        self.val_share = val_share

    @abstractmethod
    def _usable(self, example: LabelledQuery) -> bool: ...

    @abstractmethod
    def _select(
        self, x_fit: np.ndarray, fit: list[LabelledQuery], x_val: np.ndarray, val: list[LabelledQuery],
    ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        """`(chosen hyper-parameters, their validation report, every setting tried)`."""

    @abstractmethod
    def _fit_final(self, x: np.ndarray, examples: list[LabelledQuery], params: Mapping[str, Any]) -> None: ...

    def fit(
        self, examples: Sequence[LabelledQuery], embeddings: np.ndarray | None = None, note: str = "",
    ) -> dict[str, Any]:
        """Choose hyper-parameters on the hash validation split, then refit on every usable
        example. `embeddings` (same order as `examples`) saves embedding them again. Returns the
        card."""
        started = time.perf_counter()
        x_all = self._embed([e.question for e in examples]) if embeddings is None else np.asarray(embeddings)
        keep = [i for i, e in enumerate(examples) if self._usable(e)]
        usable = [examples[i] for i in keep]
        x = unit(x_all[keep]) if keep else np.zeros((0, x_all.shape[1] if x_all.ndim == 2 else 0), np.float32)
        if len({e.label for e in usable}) < 2:
            raise ConfigurationError(f"the {self.kind} router needs labelled queries of at least two tiers "
                                     f"({len(usable)} usable of {len(examples)})")
        fit_idx, val_idx = validation_split(usable, self.val_share)
        fit_part, val_part = [usable[i] for i in fit_idx], [usable[i] for i in val_idx]
        if not val_part or len({e.label for e in fit_part}) < 2:
            raise ConfigurationError(f"the validation split left {len(fit_part)} fitting and {len(val_part)} "
                                     "validation examples: too few labelled queries to choose hyper-parameters")
        params, report, grid = self._select(x[fit_idx], fit_part, x[val_idx], val_part)
        self.params = dict(params)
        self._fit_final(x, usable, self.params)
        self.card = {
            "kind": self.kind, "format": FORMAT, "description": self.description,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "note": note,
            "labels": {
                "fitted_on": label_counts(usable), "fit_part": label_counts(fit_part),
                "validation": label_counts(val_part), "excluded": len(examples) - len(usable),
                "origins": dict(Counter(e.origin for e in usable)),
                "sources": dict(Counter(e.source for e in usable)),
            },
            "validation_split": {"share": self.val_share,
                                 "rule": "sha256 of the normalised question (training.splits.validation_part)"},
            "hyperparameters": self.params, "selection": self.selection_rule,
            "validation": report, "grid": grid,
            "refit": "on every usable labelled query (fitting part + validation) with the chosen hyper-parameters",
            "seconds": round(time.perf_counter() - started, 2), "software": _software(),
        }
        return self.card


class LogisticRouter(LearnedRouterFitting, learned.LogisticRouter):
    """Multinomial logistic regression on the sentence embeddings, fitted."""

    selection_rule = ("C and class weighting with the highest validation macro-F1 of the labels; ties: "
                      "higher accuracy, then the smaller C (stronger regularisation)")
    C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)
    WEIGHTS = (None, "balanced")

    def _usable(self, example: LabelledQuery) -> bool:
        return True

    @staticmethod
    def _model(params: Mapping[str, Any]):
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(C=params["C"], class_weight=params["class_weight"], max_iter=5000)

    def _select(self, x_fit, fit, x_val, val):
        grid = []
        y_fit = [e.label.value for e in fit]
        for c in self.C_GRID:
            for weight in self.WEIGHTS:
                params = {"C": c, "class_weight": weight}
                self._set(self._model(params).fit(x_fit, y_fit))
                predicted = [tier for tier, _, _ in self._decide(x_val)]
                grid.append({"params": params, "validation": validation_report(val, predicted)})
        best = max(grid, key=lambda g: (round(g["validation"]["macro_f1"], 9),
                                        round(g["validation"]["accuracy"], 9), -g["params"]["C"]))
        return best["params"], best["validation"], grid

    def _set(self, model) -> None:
        """Keep the fitted model as arrays: logits = x @ weights.T + bias over `classes`."""
        classes = [str(c) for c in model.classes_]
        weights, bias = np.asarray(model.coef_, np.float64), np.asarray(model.intercept_, np.float64)
        if len(classes) == 2:  # sklearn keeps one row for two classes: P(second) = sigmoid(row)
            weights, bias = np.vstack([np.zeros_like(weights), weights]), np.concatenate([[0.0], bias])
        self.classes, self.weights, self.bias = classes, weights, bias

    def _fit_final(self, x, examples, params) -> None:
        self._set(self._model(params).fit(x, [e.label.value for e in examples]))


class KnnRouter(LearnedRouterFitting, learned.KnnRouter):
    """The tier most voted among the k nearest labelled queries, fitted."""

    selection_rule = ("k and vote weighting with the highest validation macro-F1 of the labels; ties: "
                      "higher accuracy, then the smaller k")
    K_GRID = (1, 3, 5, 7, 9, 15, 25, 35)
    WEIGHTINGS = ("uniform", "similarity")

    def _usable(self, example: LabelledQuery) -> bool:
        return True

    def _select(self, x_fit, fit, x_val, val):
        self.memory, self.labels = x_fit, np.array([e.label.value for e in fit])
        grid = []
        for k in (k for k in self.K_GRID if k <= len(fit)):
            for weighting in self.WEIGHTINGS:
                self.params = {"k": k, "weighting": weighting}
                predicted = [tier for tier, _, _ in self._decide(x_val)]
                grid.append({"params": dict(self.params), "validation": validation_report(val, predicted)})
        best = max(grid, key=lambda g: (round(g["validation"]["macro_f1"], 9),
                                        round(g["validation"]["accuracy"], 9), -g["params"]["k"]))
        return best["params"], best["validation"], grid

    def _fit_final(self, x, examples, params) -> None:
        self.memory, self.labels = x.astype(np.float32), np.array([e.label.value for e in examples])

    def extend(self, examples: Sequence[LabelledQuery], embeddings: np.ndarray | None = None) -> None:
        """Add labelled queries (e.g. live ones from `arag relabel`) to the memory; k stays.
        Save again to keep them (the artefact's sha256 changes)."""
        if not examples:
            return
        x = unit(self._embed([e.question for e in examples]) if embeddings is None else embeddings)
        self.memory = np.vstack([self.memory, x.astype(np.float32)])
        self.labels = np.concatenate([self.labels, [e.label.value for e in examples]])
        extended = self.card.setdefault("labels", {}).setdefault("extended", {})
        for tier, n in label_counts(examples).items():
            extended[tier] = extended.get(tier, 0) + n


class RewardRouter(LearnedRouterFitting, learned.RewardRouter):
    """Cost-aware rewards per tier, regressed from the stored outcomes (MBA-RAG style); see
    `adaptive_rag.routers.learned.RewardRouter` for the lambda rule.

    The cost is the outcome's steps (default) or its recorded seconds as a share of the mean C
    time of the questions fitted on (`cost="seconds"`: what a deployment pays when tiers take one
    step each but not the same time). A budget bounds the choice: mean steps (`step_budget`) or
    routed time as a share of always C's (`time_budget`, e.g. 0.6), on validation. With `folds`
    above 1 the choice is made on out-of-fold routes over every usable label (hash folds of the
    normalised question) instead of the one validation split: a fifth of 240 labels is too few to
    hold a time budget to a few points."""

    ALPHAS = (0.1, 1.0, 10.0, 100.0)
    LAMBDAS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0)
    COSTS = ("steps", "seconds")

    def __init__(self, embedder: Embedder | None = None, val_share: float = DEFAULT_VAL_SHARE,
                 target: str = "f1", step_budget: float | None = None, *, cost: str = "steps",
                 time_budget: float | None = None, folds: int = 1) -> None:
        super().__init__(embedder, val_share)
        if target not in ("f1", "correct"):
            raise ValueError(f"target is f1 or correct, not {target!r}")
        if cost not in self.COSTS:
            raise ValueError(f"cost is steps or seconds, not {cost!r}")
        if time_budget is not None and not 0.0 < time_budget:
            raise ValueError(f"the time budget is a positive share of always C's time, not {time_budget!r}")
        if folds < 1:
            raise ValueError(f"folds is at least 1, not {folds!r}")
        self.target, self.step_budget, self.cost = target, step_budget, cost
        self.time_budget, self.folds = time_budget, folds

    @property
    def selection_rule(self) -> str:  # type: ignore[override]
        budgets = ([f"mean steps <= {self.step_budget:g}"] if self.step_budget is not None else []) + (
            [f"time <= {self.time_budget:g} x always C's"] if self.time_budget is not None else [])
        where = ("the validation questions" if self.folds == 1 else
                 f"out-of-fold routes of every usable label ({self.folds} hash folds)")
        return (f"alpha and lambda whose routes have the highest mean stored F1 on {where} "
                f"({' and '.join(budgets) or 'no budget'}); F1 ties go to the cheaper routes, then the larger "
                "lambda; over budget everywhere: the cheapest setting")

    def _usable(self, example: LabelledQuery) -> bool:
        return example.has_rewards(self.cost) and (self.time_budget is None or example.has_rewards("seconds"))

    def _targets(self, examples: Sequence[LabelledQuery]) -> tuple[np.ndarray, np.ndarray]:
        """Correctness and cost per tier, [n, 3] each; seconds are divided by the mean C time of
        these questions."""
        quality = np.array([[
            float(e.outcomes[t].f1 if self.target == "f1" and e.outcomes[t].f1 is not None
                  else bool(e.outcomes[t].correct)) for t in TIER_VALUES] for e in examples])
        cost = np.array([[float(getattr(e.outcomes[t], self.cost)) for t in TIER_VALUES] for e in examples])
        if self.cost == "seconds":
            cost = cost / max(float(cost[:, TIER_VALUES.index("C")].mean()), 1e-9)
        return quality, cost

    def _out_of_fold(self, x: np.ndarray, examples: list[LabelledQuery], targets: np.ndarray,
                     alpha: float) -> np.ndarray:
        """Predicted `targets` ([quality | cost]) of every example by the ridge fitted on the other folds."""
        from sklearn.linear_model import Ridge

        fold = np.array([int(question_fraction(e.question, "reward-folds") * self.folds) for e in examples])
        found = np.zeros_like(targets)
        for k in range(self.folds):
            held = fold == k
            if held.any() and (~held).any():
                found[held] = Ridge(alpha=alpha).fit(x[~held], targets[~held]).predict(x[held])
        return found

    def _select(self, x_fit, fit, x_val, val):
        from sklearn.linear_model import Ridge

        out_of_fold = self.folds > 1  # every usable label is held out once
        judged, x_judged = (fit + val, np.vstack([x_fit, x_val])) if out_of_fold else (val, x_val)
        targets = np.hstack(self._targets(judged if out_of_fold else fit))
        grid = []
        for alpha in self.ALPHAS:
            predicted = (self._out_of_fold(x_judged, judged, targets, alpha) if out_of_fold
                         else Ridge(alpha=alpha).fit(x_fit, targets).predict(x_val))
            p_quality, p_cost = predicted[:, :3], predicted[:, 3:]
            for lam in self.LAMBDAS:
                tiers = [TIER_VALUES[i] for i in cheapest_best(p_quality - lam * p_cost)]
                grid.append({"params": {"alpha": alpha, "lambda": lam, "target": self.target, "cost": self.cost},
                             "validation": validation_report(judged, tiers)})

        def spent(g: Mapping[str, Any]) -> float:
            v = g["validation"]
            return v["time_share_of_c"] if self.time_budget is not None else v["routed"]["steps"]

        def within(g: Mapping[str, Any]) -> bool:
            v = g["validation"]
            return ((self.step_budget is None or v["routed"]["steps"] <= self.step_budget + TIE)
                    and (self.time_budget is None or v["time_share_of_c"] <= self.time_budget + TIE))

        kept = [g for g in grid if within(g)]
        if kept:
            best = max(kept, key=lambda g: (round(g["validation"]["routed"]["f1"], 9), -round(spent(g), 9),
                                            g["params"]["lambda"]))
        else:
            best = min(grid, key=spent)
        report = {**best["validation"], "step_budget": self.step_budget, "time_budget": self.time_budget,
                  "folds": self.folds, "within_budget": bool(kept)}
        return best["params"], report, grid

    def _fit_final(self, x, examples, params) -> None:
        from sklearn.linear_model import Ridge

        quality, cost = self._targets(examples)
        model = Ridge(alpha=params["alpha"]).fit(x, quality - params["lambda"] * cost)
        self.weights, self.bias = np.asarray(model.coef_, np.float64), np.asarray(model.intercept_, np.float64)


KINDS: dict[str, type[LearnedRouterFitting]] = {r.kind: r for r in (LogisticRouter, KnnRouter, RewardRouter)}
