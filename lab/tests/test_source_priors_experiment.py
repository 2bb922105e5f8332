"""Source priors: a dataset's prior shift is kept only where it beats the router on that dataset's
`train` labels, the `test` labels follow the oracle's rule, and the summary compares every row
with the dataset-identity rule on the same questions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from adaptive_rag.contracts import Tier
from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.evaluation.runner import Outcome
from adaptive_rag.routing.policy import RoutingPolicy
from adaptive_rag.training.bag_of_words import fit, served_thresholds
from adaptive_rag.training.learned_routers import LabelledQuery
from lab.experiments.source_priors import ROWS, fit_source_priors, readme, replay, summarise, tier_label


def _router():
    """"compare" says C; "who" says B, though A answers two in five of them."""
    examples = [LabelledQuery(f"{'who' if i % 2 else 'compare'} thing{i % 13} q{i}",
                              (Tier.A if i % 5 in (1, 3) else Tier.B) if i % 2 else Tier.C, "synthetic", str(i))
                for i in range(400)]
    return fit(examples, min_count=1)


def _outcome(dataset: str, qid: str, strategy: str, correct: bool, seconds: float) -> Outcome:
    return Outcome(qid, dataset, strategy, "x", 1, seconds, float(correct), float(correct), float(correct))


def test_a_source_whose_labels_the_text_cannot_tell_gets_a_kept_prior() -> None:
    router, policy = _router(), RoutingPolicy(served_thresholds())
    # "trivia" asks "who" questions (the router says B) that A answers: a prior towards A pays.
    rows = [SimpleNamespace(dataset="trivia", question=f"who thing{i % 13} t{i}", label="A") for i in range(30)]
    rows += [SimpleNamespace(dataset="nq", question=f"who thing{i % 13} n{i}", label="B") for i in range(30)]
    priors = fit_source_priors(router, rows, policy)
    assert priors["trivia"]["kept"] and priors["trivia"]["offsets"][0] > 0
    assert priors["trivia"]["cross_validated_accuracy"] > priors["trivia"]["router_accuracy"] == 0.0
    assert not priors["nq"]["kept"]  # the router is already right there
    assert priors["nq"]["rule_accuracy"] == 1.0 and priors["trivia"]["rule_accuracy"] == 0.0

    questions = [Question(f"q{i}", "trivia", f"who thing{i % 13} u{i}", ("x",)) for i in range(10)]
    outcomes = {}
    for q in questions:
        for strategy, seconds in (("no_retrieval", 2.0), ("single_step", 4.0), ("evidence", 8.0)):
            outcomes[(q.dataset, q.id, strategy)] = _outcome(q.dataset, q.id, strategy, True, seconds)
    del outcomes[("trivia", "q9", "evidence")]  # an incomplete question is left out
    assert tier_label(outcomes, "trivia", "q0") == "A" and tier_label(outcomes, "trivia", "q9") is None
    records = replay(router, priors, questions, outcomes, policy)
    assert len(records) == 9
    assert {r["rows"]["router + source priors"]["tier"] for r in records} == {"A"}
    assert {r["rows"]["router"]["tier"] for r in records} == {"B"}
    summary = summarise(records)
    assert set(summary) == set(ROWS)
    assert summary["router + source priors"]["accuracy"]["estimate"] == 1.0
    assert summary["dataset-identity rule"]["accuracy"]["estimate"] == 0.0  # B where A was the cheapest right
    assert summary["router + source priors"]["accuracy_minus_rule"]["estimate"] == 1.0
    assert np.isclose(summary["router + source priors"]["time_share_of_always_c"], 0.25)
    text = readme({"command": "python -m lab.experiments.source_priors", "train_labels": 60, "eval": "e",
                   "train_priors": priors, "test": summary})
    assert "| trivia | 30/0/0 |" in text and "| router + source priors | 100.0 [100.0, 100.0] |" in text
