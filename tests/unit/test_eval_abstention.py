"""Abstention measured without the reader: a knowledge base imported as a tenant's, each question
judged by every row's gate, the summaries (caught, false abstentions, per kind, paired
differences), the candidate thresholds judged from the records, and the records on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptive_rag.evaluation.abstention import (
    AUTOMATIC,
    NONE,
    GateRecord,
    KnowledgeBaseProbe,
    LabelledQuestion,
    auc,
    candidate_table,
    demo_questions,
    gate,
    import_knowledge_base,
    probe,
    read_records,
    summarise,
    write_records,
)
from adaptive_rag.knowledge.documents import Document, Section
from adaptive_rag.strategies import Abstention

DOCS = [
    Document("warranty", "Warranty", (Section("", "The frame has a lifetime warranty; the battery two years."),)),
    Document("returns", "Returns", (Section("", "Unridden bikes can be returned within 30 days of delivery."),)),
    Document("tyres", "Tyre pressure", (Section("", "Road tyres run at 80 to 100 psi, gravel tyres lower."),)),
]
QUESTIONS = [
    LabelledQuestion("q1", "How long is the battery warranty?", "covered", True, "test"),
    LabelledQuestion("q2", "Within how many days can unridden bikes be returned?", "covered", True, "test"),
    LabelledQuestion("q3", "How many days does it take to sail across the Atlantic?", "off_topic", False, "test"),
    LabelledQuestion("q4", "Quelle heure est-il ?", "off_topic", False, "test"),
]


def record(id_: str, covered: bool, relevance: float, top: float, kb: str = "kb", **abstained: bool) -> GateRecord:
    return GateRecord(kb, id_, "covered" if covered else "other", covered, "train", top, relevance, 3,
                      abstained or {NONE: False})


def test_each_question_is_judged_by_every_rows_gate(tmp_path: Path) -> None:
    service = import_knowledge_base(DOCS, tmp_path)
    info = service.describe("probe")
    retriever = service.index.retriever("probe")
    rows = {NONE: Abstention(), AUTOMATIC: Abstention(min_relevance=info.abstention.value)}
    records = gate("kb", retriever, QUESTIONS, rows, k=3)
    by_id = {r.id: r for r in records}
    assert [by_id[q].abstained[AUTOMATIC] for q in ("q1", "q2", "q3", "q4")] == [False, False, True, True]
    assert by_id["q4"].passages == 0 and by_id["q4"].abstained[NONE]  # nothing retrieved: every row
    assert not by_id["q3"].abstained[NONE] and by_id["q3"].relevance < info.abstention.value
    summary = summarise(records, (NONE, AUTOMATIC))
    automatic = summary["rows"][AUTOMATIC]
    assert (automatic["caught"]["estimate"], automatic["false_abstain"]["estimate"]) == (1.0, 0.0)
    assert summary["rows"][NONE]["caught"]["estimate"] == 0.5
    assert summary["differences"]["automatic - none, caught"]["estimate"] == 0.5
    assert set(automatic["kinds"]) == {"covered", "off_topic"}
    found = probe("kb", retriever, info.chunks, info.calibration, [d.title for d in DOCS])
    assert len(found.titles) == 3 and len(found.reference) == 160


def test_candidates_are_judged_from_the_records_per_knowledge_base() -> None:
    records = [record("a", True, 0.9, 12.0), record("b", True, 0.5, 6.0),
               record("c", False, 0.3, 9.0), record("d", False, 0.1, 2.0)]
    probes = {"kb": KnowledgeBaseProbe("kb", 4, None, reference=[(3.0, 0.2), (8.0, 0.4)],
                                       titles=[(20.0, 2.0), (15.0, 1.5)])}
    table = {row["candidate"]: row for row in candidate_table(records, probes, floors=(0.0, 0.45), quantiles=(1.0,))}
    # relevance below the largest reference relevance (0.4): both uncovered abstain, no covered one
    assert table["relevance: reference q1"]["cells"]["kb"] == (1.0, 0.0)
    assert table["relevance: reference q1, floor 0.45"]["thresholds"]["kb"] == 0.45
    # the raw top score below 8.0 lets the uncovered question scoring 9.0 through
    assert table["BM25 top score: reference q1"]["cells"]["kb"] == (0.5, 0.5)
    assert table["relevance: best split, own titles vs reference"]["thresholds"]["kb"] == 1.5


def test_auc_counts_ties_as_half() -> None:
    assert auc([1.0, 2.0], [0.5]) == 1.0
    assert auc([1.0], [1.0]) == 0.5
    assert auc([], [1.0]) is None


@pytest.mark.parametrize("name", ["records.jsonl", "records.jsonl.gz"])
def test_records_round_trip(tmp_path: Path, name: str) -> None:
    records = [record("a", True, 0.9, 12.0, automatic=False, none=False)]
    write_records(records, tmp_path / name)
    assert read_records(tmp_path / name) == records


def test_demo_questions_carry_their_kind_and_a_stable_split(tmp_path: Path) -> None:
    path = tmp_path / "questions.json"
    path.write_text(json.dumps([{"id": "x1", "question": "Q?", "kind": "covered", "needs": ["kb-1"]},
                                {"id": "x2", "question": "R?", "kind": "off_topic", "needs": []}]))
    first, second = demo_questions(path)
    assert (first.covered, second.covered) == (True, False)
    assert {first.split, second.split} <= {"train", "test"} and demo_questions(path)[0].split == first.split
