"""Retraining the served family: with the shipped bag-of-words router served, `arag retrain`
fits a bag-of-words challenger (seconds, no torch) on the `fit` labels, live ones weighted, and
promotes it only through the same checks as any challenger (validation overall and per tenant).

Real SQLite records with the migrations, real exported ONNX versions scored in-process; no Triton
(the swap on Triton: tests/e2e/test_model_swap_e2e.py)."""

from __future__ import annotations

import json

import pytest

from adaptive_rag.contracts import CLASSIFIER_MODEL
from adaptive_rag.training.bag_of_words import fit, publish
from adaptive_rag.training.learned_routers import examples_from_labels
from adaptive_rag.routing.model_repository import served_version
from adaptive_rag.settings import ClassifierSettings
from adaptive_rag.storage import LabelStore, PromotionStore, TrainingLabel, make_engine, upgrade_database
from adaptive_rag.training.retrain import RetrainOptions, resolve_family, retrain


def benchmark_labels(n: int = 60) -> list[TrainingLabel]:
    """Greetings A, who-questions B, two-part comparisons C: the benchmark's word patterns."""
    rows = []
    for i in range(n):
        for question, tier, dataset in (
            (f"hello there, thanks a lot {i}", "A", "chat"),
            (f"Who wrote book number {i}?", "B", "nq"),
            (f"Which film came out first, film {i} or film {i + 1}, and who directed both?", "C", "hotpotqa"),
        ):
            rows.append(TrainingLabel(origin="benchmark", dataset=dataset, question_id=f"{dataset}-{i}",
                                      question=question, label=tier, label_source="binary", split="train",
                                      correct_metric="none", outcomes={}))
    return rows


def tenant_labels(n: int = 40) -> list[TrainingLabel]:
    """A support tenant's questions: two-part in form, yet one FAQ entry answers them (B)."""
    return [TrainingLabel(origin="live", dataset="live:acme", question_id=f"req-{i}",
                          question=f"Which mask is safer, cloth mask {i} or paper mask {i}, and where to buy both?",
                          label="B", label_source="feedback", split="train", correct_metric="em_or_acc",
                          outcomes={}, request_id=f"req-{i}")
            for i in range(n)]


def serve_words(tmp_path, tenant_count: int = 40) -> tuple[str, ClassifierSettings]:
    """A database with benchmark and tenant labels, and a repository serving a bag-of-words router
    fitted on the benchmark labels only (what a fresh clone ships)."""
    url = f"sqlite:///{tmp_path / 'records.db'}"
    upgrade_database(url)
    store = LabelStore(make_engine(url))
    for row in benchmark_labels() + tenant_labels(tenant_count):
        store.add(row)
    champion = fit(examples_from_labels(benchmark_labels()))
    champion.save(tmp_path / "router.json")
    publish(tmp_path / "router.json", tmp_path / "repo")
    return url, ClassifierSettings(_env_file=None, model_repository=tmp_path / "repo")


@pytest.fixture
def served_words(tmp_path) -> tuple[str, ClassifierSettings]:
    return serve_words(tmp_path)


def test_auto_retrains_the_served_family(tmp_path, served_words) -> None:
    _, classifier = served_words
    assert resolve_family("auto", classifier.model_repository, CLASSIFIER_MODEL) == "words"
    assert resolve_family("auto", tmp_path / "empty", CLASSIFIER_MODEL) == "encoder"
    assert resolve_family("encoder", classifier.model_repository, CLASSIFIER_MODEL) == "encoder"
    with pytest.raises(ValueError, match="family must be one of"):
        resolve_family("t5", classifier.model_repository, CLASSIFIER_MODEL)


def test_a_words_challenger_learns_the_tenant_and_is_promoted_on_its_own_labels(tmp_path, served_words) -> None:
    url, classifier = served_words
    lines: list[str] = []
    outcome = retrain(url, classifier, RetrainOptions(out=tmp_path / "run"), log=lines.append)
    summary = outcome.summary()
    assert summary["family"] == "words" and outcome.status == "promoted", (outcome.reason, lines)
    tenant = outcome.verdict.tenants["acme"]
    assert tenant["checked"] and tenant["labels"] >= 5
    assert tenant["champion"] < 0.5 and tenant["challenger"] == 1.0  # the champion sent them to C
    assert served_version(classifier.model_repository / CLASSIFIER_MODEL) == 2
    card = json.loads((tmp_path / "run" / "router.json").read_text())["card"]
    # Hyper-parameters were chosen on a band of `fit`, not on promotion's validation labels.
    assert card["validation_split"].endswith("share 0.4")
    [row] = PromotionStore(make_engine(url)).recent(CLASSIFIER_MODEL)
    assert row.verdict == "promoted" and row.details["family"] == "words"
    assert row.details["tenants"]["acme"]["checked"] is True
    # Then the tenant's prior over the version now served (v2 already routes acme right: no gain).
    [prior] = row.details["tenant_priors"]
    assert prior["tenant"] == "acme" and prior["verdict"] == "refused"


def test_without_weighting_the_tenant_is_still_learnt_or_refused_never_made_worse(tmp_path, served_words) -> None:
    url, classifier = served_words
    outcome = retrain(url, classifier, RetrainOptions(out=tmp_path / "run", live_share=0.0), log=lambda _: None)
    tenant = outcome.verdict.tenants["acme"]
    assert outcome.status in ("promoted", "refused")
    if outcome.status == "promoted":
        assert tenant["challenger"] >= tenant["champion"]
    assert outcome.extra["tenant_priors"][0]["tenant"] == "acme"


def test_a_refused_challenger_still_leaves_the_tenant_a_prior_over_the_served_version(tmp_path) -> None:
    from adaptive_rag.routing.tenant_priors import TenantPriors
    from adaptive_rag.training.splits import validation_part

    # 12 tenant labels: enough for a prior, too few in `validation` for the challenger's tenant check.
    url, classifier = serve_words(tmp_path, tenant_count=12)
    assert sum(validation_part(row.question) == "validation" for row in tenant_labels(12)) < 5
    lines: list[str] = []
    # A gain no challenger can show: the served v1 stays, and it sends acme's questions to C.
    outcome = retrain(url, classifier, RetrainOptions(out=tmp_path / "run", min_gain=1.0), log=lines.append)
    assert outcome.status == "refused", outcome.reason
    [prior] = outcome.summary()["tenant_priors"]
    assert prior["tenant"] == "acme" and prior["verdict"] == "promoted", lines
    assert prior["champion_accuracy"] < 0.5 and prior["challenger_accuracy"] > prior["champion_accuracy"]
    stored = TenantPriors.load_or_empty(classifier.model_repository / CLASSIFIER_MODEL / "1")
    assert stored.tenants["acme"].offsets[2] < 0 and stored.tenants["acme"].revision == 1
    [row] = PromotionStore(make_engine(url)).recent(CLASSIFIER_MODEL)
    assert row.details["tenant_priors"][0]["verdict"] == "promoted"
    # Off by option: nothing fitted, nothing recorded.
    again = retrain(url, classifier, RetrainOptions(out=tmp_path / "run2", min_gain=1.0, tenant_priors=False),
                    log=lambda _: None)
    assert "tenant_priors" not in again.summary()


def serve_priced_words(tmp_path, timed: bool, confidence: float | None = None) -> tuple[str, ClassifierSettings]:
    """A repository serving a bag-of-words router priced for 70 % of always C's time; the
    database holds its labels, with every tier's outcome (`timed`) or none."""
    from adaptive_rag.training.bag_of_words import fit_time_price
    from tests.unit.test_time_price import label_rows, labels

    url = f"sqlite:///{tmp_path / 'records.db'}"
    upgrade_database(url)
    rows = label_rows([e for e in labels() if e.outcomes])
    examples = examples_from_labels(rows)
    champion = fit(examples)
    fit_time_price(champion, examples, 0.7, confidence=confidence)
    champion.save(tmp_path / "router.json")
    publish(tmp_path / "router.json", tmp_path / "repo")
    store = LabelStore(make_engine(url))
    for row in rows:
        if not timed:
            row.outcomes = {}
        store.add(row)
    return url, ClassifierSettings(_env_file=None, model_repository=tmp_path / "repo")


def test_a_retrained_router_is_priced_for_the_served_versions_time_budget(tmp_path) -> None:
    from adaptive_rag.routing.policy import PolicyThresholds
    from adaptive_rag.training.retrain import served_time_budget
    from adaptive_rag.training.time_price import TimeBudget

    url, classifier = serve_priced_words(tmp_path, timed=True)
    assert served_time_budget(classifier.model_repository, CLASSIFIER_MODEL) == TimeBudget(0.7)
    lines: list[str] = []
    outcome = retrain(url, classifier, RetrainOptions(out=tmp_path / "run", min_gain=-1.0), log=lines.append)
    assert outcome.status in ("promoted", "refused"), (outcome.reason, lines)
    assert any("priced on time for 70%" in line for line in lines)
    card = json.loads((tmp_path / "run" / "router.json").read_text())["card"]
    assert card["time_budget"]["budget"] == 0.7 and card["time_budget"]["out_of_fold"]["time_share_of_c"] <= 0.7
    exported = tmp_path / "run" / "export" / CLASSIFIER_MODEL / "1"
    thresholds = PolicyThresholds.load(exported)
    assert thresholds.time_price == card["time_budget"]["price"] and thresholds.metrics["time_budget"] == 0.7


def test_a_priced_router_without_timed_labels_is_not_retrained_into_an_unpriced_one(tmp_path) -> None:
    url, classifier = serve_priced_words(tmp_path, timed=False)
    outcome = retrain(url, classifier, RetrainOptions(out=tmp_path / "run"), log=lambda _: None)
    assert outcome.status == "failed" and "every tier's F1 and seconds" in outcome.reason
    assert served_version(classifier.model_repository / CLASSIFIER_MODEL) == 1


def test_a_budget_held_with_confidence_is_held_with_it_again_by_the_challenger(tmp_path) -> None:
    from adaptive_rag.training.retrain import served_time_budget
    from adaptive_rag.training.time_price import TimeBudget

    url, classifier = serve_priced_words(tmp_path, timed=True, confidence=0.95)
    assert served_time_budget(classifier.model_repository, CLASSIFIER_MODEL) == TimeBudget(0.7, 0.95)
    lines: list[str] = []
    outcome = retrain(url, classifier, RetrainOptions(out=tmp_path / "run", min_gain=-1.0), log=lines.append)
    assert outcome.status in ("promoted", "refused"), (outcome.reason, lines)
    assert any("priced on time for 70% of always C's time with 95% confidence" in line for line in lines)
    card = json.loads((tmp_path / "run" / "router.json").read_text())["card"]["time_budget"]
    assert card["confidence"] == 0.95 and card["out_of_fold"]["time_share_upper"] <= 0.7
