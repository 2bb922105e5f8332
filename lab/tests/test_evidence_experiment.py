"""The evidence experiment's scoring: a question is complete at k only when every part's gold is
among the first k passages, and the support suite's parts are matched by FAQ document id."""

from __future__ import annotations

from adaptive_rag.domain import Passage
from adaptive_rag.evidence import Weights
from lab.experiments.evidence import GRID, SUPPORT, Item, candidate_weights, scores


def test_complete_needs_every_supporting_title_within_the_budget() -> None:
    item = Item("2wiki", "q1", "train", "Who?", (("A",), ("B",)))
    assert scores(item, ["A", "x", "y", "z", "w", "B"]) == {
        "complete@5": 0.0, "recall@5": 0.5, "complete@8": 1.0, "recall@8": 1.0,
    }
    assert scores(item, [])["recall@8"] == 0.0


def test_a_support_part_is_answered_by_any_of_its_entries() -> None:
    item = Item(SUPPORT, "joined-1", "test", "X? And y?", (("faq-a", "faq-a2"), ("faq-b",)))
    assert item.key(Passage("faq-a2#0", "title", "text", doc_id="faq-a2")) == "faq-a2"
    assert scores(item, ["faq-a2", "faq-b"])["complete@5"] == 1.0
    assert scores(item, ["faq-a", "faq-a2"])["complete@5"] == 0.0


def test_the_candidates_are_every_combination_of_the_grid() -> None:
    candidates = candidate_weights()
    expected = 1
    for values in GRID.values():
        expected *= len(values)
    assert len(candidates) == len(set(candidates)) == expected
    assert Weights() in candidates  # B's evidence alone is among them
