"""Per-tenant prior shifts: the shift itself, its file, the fit and the verdict that keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routing.model_repository import ModelVersion
from adaptive_rag.routing.policy import PolicyThresholds, RoutingPolicy
from adaptive_rag.routing.policy import shift
from adaptive_rag.routing.tenant_priors import TENANT_PRIORS_FILE, TenantPriors
from adaptive_rag.training.tenant_adaptation import (
    MIN_LABELS,
    adapt_tenants,
    cross_validated_accuracy,
    fit_offsets,
)


def decision(probs: dict[str, float]) -> RoutingDecision:
    tier = max(probs, key=probs.get)
    return RoutingDecision(tier=Tier(tier), probabilities=probs, model_name="complexity", model_version=3,
                           reason=f"argmax {tier}")


def test_shift_multiplies_by_exp_offset_and_renormalises() -> None:
    shifted = shift({"A": 0.2, "B": 0.3, "C": 0.5}, (0.0, 0.0, float(np.log(0.5))))
    assert shifted == pytest.approx({"A": 0.2 / 0.75, "B": 0.3 / 0.75, "C": 0.25 / 0.75})


def test_adjust_redecides_only_for_the_tenant_with_a_prior() -> None:
    priors = TenantPriors().with_tenant("support", (0.0, 0.0, -2.0))
    over = decision({"A": 0.05, "B": 0.35, "C": 0.6})
    policy = RoutingPolicy(PolicyThresholds(c_threshold=None))
    adjusted = priors.adjust(over, "support", policy)
    assert adjusted.tier is Tier.B and adjusted.model_version == 3
    assert adjusted.reason.endswith("tenant prior r1: A +0.00, C -2.00")
    assert sum(adjusted.probabilities.values()) == pytest.approx(1.0)
    assert priors.adjust(over, "acme", policy) is over
    assert priors.adjust(over, None, policy) is over
    rules = RoutingDecision(tier=Tier.C, fallback=True, reason="rules")
    assert priors.adjust(rules, "support", policy) is rules


def test_the_file_round_trips_and_counts_revisions(tmp_path: Path) -> None:
    priors = TenantPriors().with_tenant("support", (0.1, 0.0, -1.0), "first")
    priors = priors.with_tenant("support", (0.2, 0.0, -1.5), "second").with_tenant("acme", (0.0, 0.0, 0.3))
    priors.save(tmp_path)
    loaded = TenantPriors.load_or_empty(tmp_path)
    assert loaded == priors and loaded.tenants["support"].revision == 2
    assert TenantPriors.load_or_empty(tmp_path / "missing") == TenantPriors()
    (tmp_path / TENANT_PRIORS_FILE).write_text('{"tenants": {"x": {"offsets": [1, 2]}}}', encoding="utf-8")
    with pytest.raises(ConfigurationError, match="3 finite offsets"):
        TenantPriors.load_or_empty(tmp_path)
    (tmp_path / TENANT_PRIORS_FILE).write_text("[", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="unreadable"):
        TenantPriors.load_or_empty(tmp_path)


def objective(log_probs: np.ndarray, y: np.ndarray, b: np.ndarray, l2: float) -> float:
    z = log_probs + b
    z = z - z.max(axis=1, keepdims=True)
    return float((z[np.arange(len(y)), y] - np.log(np.exp(z).sum(axis=1))).sum() - l2 * (b ** 2).sum())


def test_fit_offsets_finds_the_penalised_maximum_with_b_fixed_at_zero() -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet([1, 1, 3], size=40)  # a router that leans to C
    y = rng.choice(3, size=40, p=[0.1, 0.8, 0.1])  # a tenant whose labels are mostly B
    log_probs = np.log(probs)
    b = fit_offsets(log_probs, y, l2=1.0)
    assert b[1] == 0.0 and b[2] < 0
    best = objective(log_probs, y, b, 1.0)
    for delta in ([0.01, 0, 0], [-0.01, 0, 0], [0, 0, 0.01], [0, 0, -0.01]):
        assert objective(log_probs, y, b + np.array(delta), 1.0) < best
    assert np.abs(fit_offsets(log_probs, y, l2=1e6)).max() < 1e-3  # a strong prior keeps it at 0


@dataclass
class Row:
    question: str
    label: str
    dataset: str = "live:support"
    split: str = "train"


def over_retrieving_router(questions: list[str]) -> np.ndarray:
    """C for every "faq" question, B for the rest: a router that over-retrieves on FAQs."""
    return np.array([[0.05, 0.4, 0.55] if "faq" in q else [0.05, 0.9, 0.05] for q in questions])


def version_dir(tmp_path: Path) -> ModelVersion:
    path = tmp_path / "complexity" / "1"
    path.mkdir(parents=True)
    return ModelVersion("complexity", 1, path, 128, ("A", "B", "C"))


def test_a_prior_that_routes_the_tenants_labels_better_is_kept_and_not_refitted_without_gain(tmp_path: Path) -> None:
    rows = [Row(f"faq question number {i}?", "B") for i in range(16)]
    rows += [Row(f"how do I update the firmware to version {i}?", "B") for i in range(6)]
    rows += [Row(f"how long is the warranty of model {i}? and which faq covers returns of model {i}?", "C") for i in range(2)]
    rows += [Row("hi there!", "A"), Row("faq in test", "B", split="test"),
             Row("faq of another dataset", "B", dataset="squad")]
    version = version_dir(tmp_path)
    logs: list[str] = []
    first = adapt_tenants(rows, version, logs.append, probabilities=over_retrieving_router)
    assert [v.tenant for v in first] == ["support"]
    verdict = first[0]
    assert verdict.labels == 24  # small talk, `test` and benchmark rows left out
    assert verdict.verdict == "promoted" and verdict.revision == 1
    assert verdict.champion_accuracy == pytest.approx(8 / 24)  # the router alone: FAQs to C
    assert verdict.challenger_accuracy > verdict.champion_accuracy
    assert verdict.challenger_offsets[2] < 0
    stored = TenantPriors.load_or_empty(version.path).tenants["support"]
    assert list(stored.offsets) == pytest.approx(verdict.challenger_offsets, abs=1e-4)
    assert "support" in logs[0]
    again = adapt_tenants(rows, version, logs.append, probabilities=over_retrieving_router)[0]
    assert again.verdict == "refused"  # the same labels: not strictly better than itself
    assert TenantPriors.load_or_empty(version.path).tenants["support"].revision == 1


def test_too_few_labels_are_not_fitted(tmp_path: Path) -> None:
    rows = [Row(f"faq: how do I return order {i}?", "B") for i in range(MIN_LABELS - 1)]
    verdict = adapt_tenants(rows, version_dir(tmp_path), probabilities=over_retrieving_router)[0]
    assert verdict.verdict == "skipped" and "fewer than" in verdict.reason
    assert not (tmp_path / "complexity" / "1" / TENANT_PRIORS_FILE).exists()


def test_cross_validation_never_fits_on_the_fold_it_scores() -> None:
    # Labels that contradict the router in only one question: leaving it out, nothing moves.
    questions = [f"q{i}" for i in range(10)]
    probs = np.array([[0.05, 0.9, 0.05]] * 10)
    labels = ["B"] * 9 + ["C"]
    policy = RoutingPolicy(PolicyThresholds(c_threshold=None))
    assert cross_validated_accuracy(probs, labels, questions, policy) == pytest.approx(0.9)
