"""Fit each tenant's prior shift (`adaptive_rag.routing.tenant_priors`) on its own live labels,
and keep it only when it routes them better: the per-tenant half of a retraining run.

- Labels: the tenant's live `train` labels (`live:<tenant>`), without small-talk turns (the front
  door answers those before asking the router). Its `test` labels are never read.
- Probabilities: the served version run in-process (`LocalOnnxClassifier`, the numbers Triton
  gives), then the version's own policy (thresholds) picks the tier, as in serving.
- Fit: maximum likelihood of the labels under softmax(log p + b), b = (b_A, 0, b_C), with a
  Gaussian prior on b (`PRIOR_L2`) so a handful of labels cannot push it far; Newton steps on a
  two-parameter convex problem.
- Verdict: the challenger's tier accuracy under `FOLDS`-fold cross-validation grouped by normalised
  question (a repeated question never sits on both sides), against the champion's (the tenant's
  current offsets, or none) on the same labels. Strictly better: refitted on all the labels,
  written beside the served version, used by the front door at its next poll. Otherwise the
  champion stays. Fewer than `MIN_LABELS` labels: not fitted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from adaptive_rag.routing.model_repository import ModelVersion
from adaptive_rag.routing.policy import RoutingPolicy, shift
from adaptive_rag.routing.small_talk import small_talk_intent
from adaptive_rag.contracts import TIER_VALUES
from adaptive_rag.routing.tenant_priors import TenantPriors
from adaptive_rag.training.splits import LIVE_PREFIX, question_fraction

PRIOR_L2 = 1.0  # penalty on |b|^2 in summed log-likelihood units (a N(0, 0.5) prior per offset)
FOLDS = 5
MIN_LABELS = 10
_B = TIER_VALUES.index("B")

Log = Callable[[str], None]


def fit_offsets(log_probs: np.ndarray, labels: Sequence[int], l2: float = PRIOR_L2) -> np.ndarray:
    """The offsets (A, B=0, C) maximising sum log softmax(log_probs + b)[label] - l2 |b|^2."""
    y = np.bincount(np.asarray(labels, dtype=int), minlength=len(TIER_VALUES)).astype(float)
    free = [i for i in range(len(TIER_VALUES)) if i != _B]
    b = np.zeros(len(TIER_VALUES))
    for _ in range(50):
        z = log_probs + b
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        gradient = (y - p.sum(axis=0) - 2 * l2 * b)[free]  # ascent direction of the objective
        hessian = -(np.diag(p.sum(axis=0)) - p.T @ p)[np.ix_(free, free)] - 2 * l2 * np.eye(len(free))
        step = np.linalg.solve(hessian, -gradient)
        b[free] += step
        if np.abs(step).max() < 1e-9:
            break
    return b


def routed_tiers(probabilities: np.ndarray, offsets: np.ndarray | Sequence[float], policy: RoutingPolicy) -> list[str]:
    """The tier the policy picks for each row after the shift."""
    return [policy.tier(shift(dict(zip(TIER_VALUES, row)), tuple(offsets)))[0].value  # type: ignore[arg-type]
            for row in probabilities]


def accuracy(probabilities: np.ndarray, labels: Sequence[str], offsets: Sequence[float], policy: RoutingPolicy) -> float:
    routed = routed_tiers(probabilities, np.asarray(offsets, dtype=float), policy)
    return sum(r == t for r, t in zip(routed, labels)) / len(labels)


def cross_validated_accuracy(probabilities: np.ndarray, labels: Sequence[str], questions: Sequence[str],
                             policy: RoutingPolicy, folds: int = FOLDS, l2: float = PRIOR_L2) -> float:
    """Tier accuracy of offsets fitted without each fold's questions, on that fold."""
    fold_of = np.array([int(question_fraction(q, "tenant-prior") * folds) for q in questions])
    log_probs = np.log(np.clip(probabilities, 1e-12, None))
    y = np.array([TIER_VALUES.index(t) for t in labels])
    right = 0
    for k in range(folds):
        held = fold_of == k
        if not held.any():
            continue
        offsets = fit_offsets(log_probs[~held], y[~held], l2) if (~held).any() else np.zeros(len(TIER_VALUES))
        routed = routed_tiers(probabilities[held], offsets, policy)
        right += sum(r == t for r, t in zip(routed, np.asarray(labels)[held]))
    return right / len(labels)


@dataclass
class TenantVerdict:
    """What the run decided for one tenant (`verdict`: promoted | refused | skipped)."""

    tenant: str
    verdict: str
    reason: str
    labels: int
    label_tiers: dict[str, int] = field(default_factory=dict)
    champion_offsets: list[float] | None = None
    challenger_offsets: list[float] | None = None
    champion_accuracy: float | None = None
    challenger_accuracy: float | None = None  # cross-validated
    revision: int | None = None

    def summary(self) -> dict[str, Any]:
        return asdict(self)


def tenant_labels(rows: Sequence[Any]) -> dict[str, list[Any]]:
    """Live `train` label rows per tenant, small-talk turns left out."""
    by_tenant: dict[str, list[Any]] = {}
    for row in rows:
        if row.dataset.startswith(LIVE_PREFIX) and row.split == "train" and small_talk_intent(row.question) is None:
            by_tenant.setdefault(row.dataset[len(LIVE_PREFIX):], []).append(row)
    return by_tenant


def adapt_tenants(rows: Sequence[Any], version: ModelVersion, log: Log = print,
                  probabilities: Callable[[list[str]], np.ndarray] | None = None) -> list[TenantVerdict]:
    """Fit and judge every tenant's prior for the served `version` (rows: `train` labels with
    `dataset`, `split`, `question`, `label`); writes the promoted ones beside the version.
    `probabilities` (tests) replaces running the version."""
    by_tenant = tenant_labels(rows)
    if not by_tenant:
        return []
    if probabilities is None:
        from adaptive_rag.routers.local_classifier import LocalOnnxClassifier

        probabilities = LocalOnnxClassifier(version).probabilities
    policy = RoutingPolicy(version.thresholds())
    priors = TenantPriors.load_or_empty(version.path)
    verdicts: list[TenantVerdict] = []
    changed = False
    for tenant, labelled in sorted(by_tenant.items()):
        labels = [row.label for row in labelled]
        verdict = TenantVerdict(tenant, "skipped", "", len(labels), dict(sorted(Counter(labels).items())))
        verdicts.append(verdict)
        if len(labels) < MIN_LABELS:
            verdict.reason = f"{len(labels)} live `train` labels, fewer than {MIN_LABELS}"
            continue
        questions = [row.question for row in labelled]
        probs = np.asarray(probabilities(questions), dtype=float)
        current = priors.get(tenant)
        champion = np.asarray(current.offsets if current else (0.0,) * len(TIER_VALUES))
        verdict.champion_offsets = [round(float(o), 4) for o in champion]
        verdict.champion_accuracy = accuracy(probs, labels, champion, policy)
        verdict.challenger_accuracy = cross_validated_accuracy(probs, labels, questions, policy)
        offsets = fit_offsets(np.log(np.clip(probs, 1e-12, None)), [TIER_VALUES.index(t) for t in labels])
        verdict.challenger_offsets = [round(float(o), 4) for o in offsets]
        scores = (f"challenger {verdict.challenger_accuracy:.1%} (cross-validated) vs champion "
                  f"{verdict.champion_accuracy:.1%} on {len(labels)} labels")
        if verdict.challenger_accuracy > verdict.champion_accuracy:
            note = f"fitted on {len(labels)} live `train` labels {verdict.label_tiers}; {scores}"
            priors = priors.with_tenant(tenant, tuple(offsets), note)  # type: ignore[arg-type]
            verdict.verdict, verdict.reason = "promoted", scores
            verdict.revision = priors.tenants[tenant].revision
            changed = True
        else:
            verdict.verdict, verdict.reason = "refused", f"not better: {scores}"
        log(f"tenant prior {tenant!r}: {verdict.verdict}, {verdict.reason}; offsets A/B/C {verdict.challenger_offsets}")
    if changed:
        priors.save(version.path)
    return verdicts
