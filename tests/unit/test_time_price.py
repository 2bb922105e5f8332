"""The price on time: chosen out of fold on labels with every tier's outcome, to hold a budget
of always C's time; carried by the bag-of-words router into the version it publishes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routing.model_repository import open_version
from adaptive_rag.routing.policy import PolicyThresholds, RoutingPolicy
from adaptive_rag.training.bag_of_words import (
    BagOfWordsRouter, fit, fit_time_price, model_card, publish, served_thresholds,
)
from adaptive_rag.training.learned_routers import LabelledQuery, TierOutcome
from adaptive_rag.training.time_price import (
    TimeBudget, choose_price, out_of_fold_probabilities, priced_thresholds, tier_costs,
)


def outcomes(f1: tuple[float, float, float], seconds=(2.0, 4.0, 8.0)) -> dict[str, TierOutcome]:
    return {t: TierOutcome(f1=f, seconds=s, correct=f > 0.5) for t, f, s in zip("ABC", f1, seconds)}


def labels(n: int = 30) -> list[LabelledQuery]:
    """Per i: a lookup question B answers, a two-hop one only C answers, and one only C answers
    although it reads like a lookup (what a price trades away first); plus binary labels."""
    found = []
    for i in range(n):
        found.append(LabelledQuery(f"Who wrote book number {i}?", Tier.B, "nq", f"b{i}",
                                   outcomes=outcomes((0.0, 1.0, 1.0))))
        found.append(LabelledQuery(f"Which film came out first, film {i} or film {i + 1}, and who directed both?",
                                   Tier.C, "hotpotqa", f"c{i}", outcomes=outcomes((0.0, 0.0, 1.0))))
        found.append(LabelledQuery(f"Who directed the film that came out in year {i}?", Tier.C, "musique",
                                   f"m{i}", outcomes=outcomes((0.0, 0.0, 0.5))))
        found.append(LabelledQuery(f"When was city number {i} founded?", Tier.B, "nq", f"n{i}", source="binary"))
    return found


def test_costs_are_each_tiers_mean_time_over_cs():
    assert tier_costs([e for e in labels(4) if e.outcomes]) == pytest.approx((0.25, 0.5, 1.0))


def test_every_question_is_judged_by_a_router_that_never_saw_it():
    examples, fitted_on, asked = labels(), [], []

    def fit_part(part):
        fitted_on.append({e.question for e in part})

        def probabilities(questions):
            asked.append(set(questions))
            return np.tile([0.1, 0.3, 0.6], (len(questions), 1))
        return probabilities

    judged, probabilities = out_of_fold_probabilities(examples, fit_part, folds=5)
    assert len(judged) == 90 and probabilities.shape == (90, 3)  # the binary labels have no outcomes
    assert set().union(*asked) == {e.question for e in judged}
    for seen, questions in zip(fitted_on, asked):
        assert not seen & questions
        assert {e.question for e in examples if not e.outcomes} <= seen  # binary labels always fit on


def test_the_price_buys_the_most_f1_within_the_budget():
    judged = [e for e in labels() if e.outcomes]
    # the router: sure of C for comparisons, unsure (C by a little) for the lookalikes
    probabilities = np.array([[0.05, 0.9, 0.05] if e.dataset == "nq" else
                              [0.02, 0.08, 0.9] if e.dataset == "hotpotqa" else [0.05, 0.45, 0.5]
                              for e in judged])
    free = choose_price(judged, probabilities, budget=1.0)
    assert free.price == 0.0 and free.routed == {"A": 0, "B": 30, "C": 60}
    assert free.time_share_of_c == pytest.approx((30 * 4 + 60 * 8) / (90 * 8))  # 83 %
    held = choose_price(judged, probabilities, budget=0.7)
    assert held.within_budget and held.time_share_of_c <= 0.7
    assert held.routed == {"A": 0, "B": 60, "C": 30}  # the unsure C questions go to B first
    assert held.f1 == pytest.approx((30 + 30) / 90) and held.always_b_f1 == pytest.approx(30 / 90)
    served = RoutingPolicy(priced_thresholds(PolicyThresholds(None, None), held.card()))
    assert held.price > 0.0 and served.tier([0.05, 0.45, 0.5])[0] is Tier.B
    impossible = choose_price(judged, probabilities, budget=0.1)
    assert not impossible.within_budget and impossible.routed["C"] == 0  # the cheapest routes


def test_a_budget_held_with_confidence_keeps_the_upper_bound_within_it():
    judged = [e for e in labels() if e.outcomes]
    # unsure C questions with graded certainty: each price sends a few more of them to B
    probabilities = np.array([[0.05, 0.9, 0.05] if e.dataset == "nq" else
                              [0.05, 0.45 - 0.01 * (i % 20), 0.5 + 0.01 * (i % 20)]
                              for i, e in enumerate(judged)])
    point = choose_price(judged, probabilities, budget=0.75)
    held = choose_price(judged, probabilities, budget=0.75, confidence=0.95)
    assert point.confidence is None and point.time_share_upper is None
    assert held.time_share_upper is not None and held.time_share_upper <= 0.75
    assert held.time_share_of_c < held.time_share_upper  # the estimate sits below its upper bound
    assert held.time_share_of_c <= point.time_share_of_c and held.price >= point.price
    assert held.time_share_of_c < 0.75 - 0.005  # a margin the point choice does not keep
    assert all("time_share_upper" in g for g in held.grid) and not any("time_share_upper" in g for g in point.grid)
    card = held.card()
    assert card["confidence"] == 0.95 and card["out_of_fold"]["time_share_upper"] <= 0.75
    thresholds = priced_thresholds(PolicyThresholds(None, None), card)
    assert thresholds.metrics["time_budget"] == 0.75 and thresholds.metrics["time_budget_confidence"] == 0.95
    assert "with 95% confidence" in thresholds.note
    assert "time_budget_confidence" not in priced_thresholds(PolicyThresholds(None, None), point.card()).metrics
    again = choose_price(judged, probabilities, budget=0.75, confidence=0.95)
    assert again.time_share_upper == held.time_share_upper  # seeded: the same choice every time


def test_a_confidence_outside_half_to_one_is_refused():
    judged = [e for e in labels() if e.outcomes]
    for confidence in (0.3, 1.0):
        with pytest.raises(ConfigurationError, match="confidence"):
            choose_price(judged, np.full((len(judged), 3), 1 / 3), budget=0.7, confidence=confidence)
    assert TimeBudget(0.6, 0.95).describe() == "60% of always C's time with 95% confidence"


def test_labels_without_outcomes_or_a_budget_of_nothing_are_refused():
    with pytest.raises(ConfigurationError, match="every tier's F1 and seconds"):
        out_of_fold_probabilities([e for e in labels() if not e.outcomes], lambda part: None)
    judged = [e for e in labels() if e.outcomes]
    with pytest.raises(ConfigurationError, match="positive share"):
        choose_price(judged, np.full((len(judged), 3), 1 / 3), budget=0.0)


def test_the_router_carries_its_price_into_the_version_it_publishes(tmp_path):
    examples = labels()
    router = fit(examples)
    assert served_thresholds(router).time_price is None  # unpriced: its own argmax
    priced = fit_time_price(router, examples, 0.7)
    assert router.card["time_budget"] == priced and priced["within_budget"]
    assert priced["out_of_fold"]["time_share_of_c"] <= 0.7 and priced["price"] > 0.0
    path = tmp_path / "router.json"
    router.save(path)
    loaded = BagOfWordsRouter.load(path)
    thresholds = served_thresholds(loaded)
    assert thresholds.time_price == priced["price"] and thresholds.tier_costs == pytest.approx((0.25, 0.5, 1.0))
    version = open_version(publish(path, tmp_path / "repo").path.parent.parent)
    assert version.thresholds() == thresholds
    assert json.loads((version.path / "thresholds.json").read_text())["time_price"] == priced["price"]
    assert "served with a price on time" in model_card(path)


def test_pricing_needs_a_fitted_routers_hyper_parameters():
    router = fit(labels())
    router.card = {}
    with pytest.raises(ConfigurationError, match="hyper-parameters"):
        fit_time_price(router, labels(), 0.6)


def _plain(output: str) -> str:
    """The CLI's message without rich's box drawing and line wrapping."""
    return " ".join(output.replace("│", " ").split())


def label_rows(examples):
    from adaptive_rag.storage.models import TrainingLabel

    return [TrainingLabel(origin="benchmark", dataset=e.dataset, question_id=e.question_id, question=e.question,
                          label=e.label.value, label_source="silver", split="train", correct_metric="em_or_acc",
                          outcomes={t: {"f1": o.f1, "correct": o.correct, "steps": 1, "seconds": o.seconds}
                                    for t, o in e.outcomes.items()})
            for e in examples]


def test_the_cli_fits_the_router_with_its_price_and_refuses_labels_without_outcomes(tmp_path):
    from typer.testing import CliRunner

    from adaptive_rag.cli import app
    from adaptive_rag.storage.labels import write_label_file

    runner = CliRunner()
    timed_rows = label_rows([e for e in labels() if e.outcomes])
    write_label_file(timed_rows, tmp_path / "labels.jsonl")
    out = tmp_path / "priced"
    common = ["routers", "fit-words", "--no-fill-binary", "--no-support", "--out", str(out)]
    result = runner.invoke(app, [*common, "--labels-file", str(tmp_path / "labels.jsonl"), "--time-budget", "0.7"])
    assert result.exit_code == 0, result.output
    assert "time price" in result.output
    router = BagOfWordsRouter.load(out / "router.json")
    assert router.card["time_budget"]["budget"] == 0.7 and router.card["time_budget"]["price"] > 0.0
    assert "served with a price on time" in (out / "MODEL_CARD.md").read_text()

    for row in timed_rows:
        row.outcomes = {}
    write_label_file(timed_rows, tmp_path / "untimed.jsonl")
    result = runner.invoke(app, [*common, "--labels-file", str(tmp_path / "untimed.jsonl"), "--time-budget", "0.6"])
    assert result.exit_code == 2 and "every tier's F1 and seconds" in _plain(result.output)
    result = runner.invoke(app, [*common, "--labels-file", str(tmp_path / "labels.jsonl"), "--time-budget", "0"])
    assert result.exit_code == 2 and "--time-budget" in _plain(result.output)
    result = runner.invoke(app, [*common, "--labels-file", str(tmp_path / "labels.jsonl"), "--budget-confidence", "0.95"])
    assert result.exit_code == 2 and "give both" in _plain(result.output)
    result = runner.invoke(app, [*common, "--labels-file", str(tmp_path / "labels.jsonl"), "--time-budget", "0.7",
                                 "--budget-confidence", "0.95"])
    assert result.exit_code == 0 and "upper bound" in _plain(result.output), result.output
    held = BagOfWordsRouter.load(out / "router.json").card["time_budget"]
    assert held["confidence"] == 0.95 and "with 95% confidence" in (out / "MODEL_CARD.md").read_text()
