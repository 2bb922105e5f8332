"""The time-budget replay: the priced router is the shipped one with a price, its routes are the
served policy's, and the summary puts both beside always B and always C on the same questions."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.evaluation.runner import Outcome
from adaptive_rag.training.bag_of_words import fit, fit_time_price
from lab.experiments.time_budget import (
    ROWS, curve_on_test, priced_row, readme, replay, same_weights, summarise,
)
from tests.unit.test_time_price import labels

SECONDS = {"no_retrieval": 2.0, "single_step": 4.0, "evidence": 8.0}


@pytest.fixture(scope="module")
def routers():
    examples = labels()
    shipped = fit(examples)
    priced = copy.deepcopy(shipped)
    fit_time_price(priced, examples, 0.7)
    return shipped, priced


def _outcomes(questions, b_right: set[str]):
    found = {}
    for q in questions:
        for strategy, seconds in SECONDS.items():
            right = strategy == "evidence" or (strategy == "single_step" and q.id in b_right)
            found[(q.dataset, q.id, strategy)] = Outcome(q.id, q.dataset, strategy, "x", 1, seconds,
                                                         float(right), float(right), float(right))
    return found


def test_the_priced_router_sends_the_unsure_lookalikes_to_b_and_saves_time(routers):
    shipped, priced = routers
    assert same_weights(shipped, priced) and "time_budget" not in shipped.card
    questions = [Question(f"m{i}", "musique", f"Who directed the film that came out in year {i}?", ("x",))
                 for i in range(50, 56)]
    questions += [Question(f"h{i}", "hotpotqa", f"Which film came out first, film {i} or film {i + 1}, and who "
                           "directed both?", ("x",)) for i in range(60, 66)]
    outcomes = _outcomes(questions, b_right=set())
    del outcomes[("musique", "m55", "evidence")]  # an incomplete question is left out
    records = replay(shipped, [priced], questions, outcomes)
    assert len(records) == 11
    lookalikes = [r for r in records if r["dataset"] == "musique"]
    assert {r["rows"]["shipped router"]["tier"] for r in lookalikes} == {"C"}
    assert {r["rows"]["priced router"]["tier"] for r in lookalikes} == {"B"}
    summary = summarise(records)
    assert set(summary) == set(ROWS) | {"priced router"}
    paid, own = summary["priced router"], summary["shipped router"]
    assert paid["time_share_of_always_c"]["estimate"] < own["time_share_of_always_c"]["estimate"] == 1.0
    assert paid["f1_minus_always_b"]["estimate"] < own["f1_minus_always_b"]["estimate"]  # B was wrong there
    assert paid["routed"] == {"A": 0, "B": 5, "C": 6}
    curve = curve_on_test(priced, questions, outcomes, [0.0, priced.card["time_budget"]["price"]])
    assert curve[0]["time_share_of_c"] == pytest.approx(1.0)
    assert np.isclose(curve[1]["time_share_of_c"], paid["time_share_of_always_c"]["estimate"])
    text = readme({"command": "python -m lab.experiments.time_budget", "fit_commands": ["arag routers fit-words"],
                   "eval": "e", "time_budget": priced.card["time_budget"], "test": summary})
    assert "| priced router |" in text and "of always C's time" in text


def test_a_router_priced_with_confidence_gets_its_own_row(routers):
    shipped, priced = routers
    held = copy.deepcopy(shipped)
    fit_time_price(held, labels(), 0.7, confidence=0.95)
    assert priced_row(held.card["time_budget"]) == "priced router (95% bound)"
    questions = [Question(f"m{i}", "musique", f"Who directed the film that came out in year {i}?", ("x",))
                 for i in range(50, 56)]
    records = replay(shipped, [priced, held], questions, _outcomes(questions, b_right=set()))
    summary = summarise(records)
    assert set(summary) == set(ROWS) | {"priced router", "priced router (95% bound)"}
    assert (summary["priced router (95% bound)"]["time_share_of_always_c"]["estimate"]
            <= summary["priced router"]["time_share_of_always_c"]["estimate"])
    cards = [priced.card["time_budget"], held.card["time_budget"]]
    text = readme({"command": "c", "fit_commands": ["a", "b"], "eval": "e", "sample": "questions 101-148",
                   "time_budget": cards[0], "priced": [{"row": priced_row(c), "time_budget": c} for c in cards],
                   "test": summary})
    assert "| priced router (95% bound) |" in text and "upper bound" in text and "questions 101-148" in text


def test_a_router_with_other_weights_is_not_the_shipped_one_priced(routers):
    shipped, priced = routers
    other = copy.deepcopy(priced)
    other.bias = other.bias + 0.1
    assert not same_weights(shipped, other)
