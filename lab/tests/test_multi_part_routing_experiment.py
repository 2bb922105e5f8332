"""The multi-part routing measure: its question set, its counting and its report."""

from __future__ import annotations

import json

from lab.experiments.multi_part_routing import DESIGN, HELD_OUT, Asked, load_questions, markdown, route_all, summarise


def test_every_question_is_loaded_once_and_quillbill_joined_questions_count_as_multi_part() -> None:
    rows = load_questions()
    ids = [row[0] for row in rows]
    assert len(ids) == len(set(ids))
    held = [row for row in rows if row[1] == HELD_OUT]
    assert {row[2] for row in held} >= {"and_clause", "and_verb", "compare", "if_so", "list", "several", "suite", "single"}
    assert any(row[0] == "qb-j001" and row[2] == "suite" for row in held)
    assert any(row[0] == "qb-q001" and row[2] == "suite" for row in held)  # "... and do I need a credit card?"
    assert all(row[4] == 1 for row in rows if row[2] == "single")


def test_a_single_question_the_router_sends_to_c_counts_as_false_and_a_comparison_stays_whole() -> None:
    rows = [("m1", DESIGN, "and_clause", "How long is the trial and do I need a card for it?", 2),
            ("m2", DESIGN, "compare", "Compare the Plus plan with the Pro plan.", 2),
            ("s1", DESIGN, "single", "How long is the trial?", 1),
            ("s2", DESIGN, "single", "Which bulbs are dimmable?", 1)]
    asked = route_all(rows, lambda questions: ["B", "B", "C", "B"])
    summary = summarise(asked)[DESIGN]
    assert summary["reach_c"]["shipped"]["hits"] == 2 and summary["split_as_written"]["hits"] == 2
    assert summary["false_c"]["shipped"]["hits"] == 1 and summary["false_c"]["rules"]["hits"] == 0
    assert asked[0].parts == ["How long is the trial", "do I need a card for it?"]


def test_the_report_names_the_misses_and_the_verdict() -> None:
    asked = [Asked("m", kb, "list", "What are the fees for A, B and C?", 3, ["a", "b", "c"], "C", "C")
             for kb in (DESIGN, HELD_OUT)]
    asked += [Asked("s", HELD_OUT, "single", "Which plans include bank feeds?", 1, ["x"], "B", "C")]
    text = markdown(summarise(asked), asked, "python -m lab.experiments.multi_part_routing")
    assert "does not meet the targets" in text and "Which plans include bank feeds? (the router)" in text
    assert json.dumps(summarise(asked))  # the summary is plain JSON


def test_parts_retrieval_counts_every_joined_question_and_reading_by_parts_finds_no_fewer_entries() -> None:
    from adaptive_rag.settings import Settings
    from lab.experiments.multi_part_routing import parts_retrieval

    found = parts_retrieval(Settings())
    assert set(found) == {"covid-faq", HELD_OUT}
    for row in found.values():
        assert row["n"] > 0 and row["split_in_parts"] == row["n"]
        assert row["c_parts"]["hits"] >= row["b"]["hits"]
