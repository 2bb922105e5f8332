"""The evidence-budget experiments' scoring: gold coverage of the evidence, the side-by-side summary."""

from __future__ import annotations

from lab.experiments.evidence_budget import Answer, Question, interleave, summarize
from lab.experiments.evidence_budget_curve import Item, coverage


def item(suite: str, golds: list[str]) -> Item:
    return Item(suite, "x", "q1", "question?", golds, [], [])


def test_coverage_is_containment_for_short_answers_and_word_recall_for_support_answers():
    assert coverage(item("benchmark", ["the Danube"]), "[1] Vienna: The Danube flows through it.") == 1.0
    assert coverage(item("benchmark", ["Danube river"]), "[1] Vienna: The Danube flows.") == 0.0
    assert coverage(item("benchmark", ["Dan"]), "[1] Vienna: The Danube flows.") == 0.0  # word boundaries
    assert coverage(item("support", ["Returns take 30 days.", "Never"]), "[1] R: returns within 30 days") == 3 / 4


def answer(source: str, qid: str, way: str, seconds: float, f1: float, answered: bool = True) -> Answer:
    return Answer("support", source, qid, way, 0, "q", "a", answered, seconds, 100, 50, 10, f1, f1, 1.0)


def test_summary_pairs_each_question_and_times_only_questions_both_ways_read():
    answers = []
    for n in range(6):
        answers += [answer("help-centre", f"q{n}", "whole", 10.0 + n, 0.5),
                    answer("help-centre", f"q{n}", "budget", 4.0 + n, 0.6)]
    answers += [answer("help-centre", "gated", "whole", 0.01, 0.0, False),
                answer("help-centre", "gated", "budget", 0.01, 0.0, False)]
    cell = summarize(answers, {})["groups"]["help-centre"]
    assert cell["n"] == 7 and cell["n_read"] == 6
    assert cell["whole"]["p50_s"] == 12.5 and cell["budget"]["p50_s"] == 6.5
    assert abs(cell["p50_ratio"]["estimate"] - 6.5 / 12.5) < 1e-9
    assert abs(cell["f1_diff"]["estimate"] - 0.6 * 6 / 7 + 0.5 * 6 / 7) < 1e-9


def test_questions_are_interleaved_across_sources_in_proportion():
    asked = [Question("support", s, f"{s}{i}", "q", [], []) for s in ("a", "b") for i in range(2)]
    assert [q.id for q in interleave(asked)] == ["a0", "b0", "a1", "b1"]
    asked = [Question("support", "h", f"h{i}", "q", [], []) for i in range(4)] + [
        Question("support", "c", f"c{i}", "q", [], []) for i in range(2)]
    assert [q.id for q in interleave(asked)] == ["h0", "c0", "h1", "h2", "c1", "h3"]
