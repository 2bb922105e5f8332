"""Live labels from results, shadow runs and feedback."""

from __future__ import annotations

import hashlib

from adaptive_rag.contracts import SHADOW_TIER, AnswerResult, ResultKind
from adaptive_rag.training.relabel import FeedbackVerdict, TierRun, live_label


def runs(primary: tuple[str, str | None], shadow: tuple[str, str | None] | None = None) -> list[TierRun]:
    found = [TierRun(primary[0], primary[1], "primary")]
    if shadow:
        found.append(TierRun(shadow[0], shadow[1], "shadow"))
    return found


def test_no_feedback_or_neutral_rating_gives_no_label() -> None:
    assert live_label(runs(("B", "Paris")), []) is None
    assert live_label(runs(("B", "Paris")), [FeedbackVerdict(0)]) is None


def test_thumbs_up_confirms_the_routed_tier() -> None:
    label = live_label(runs(("B", "Paris")), [FeedbackVerdict(1)])
    assert (label.tier, label.source) == ("B", "feedback")


def test_cheaper_shadow_with_the_same_answer_moves_the_label_down() -> None:
    label = live_label(runs(("C", "Paris"), ("B", "paris.")), [FeedbackVerdict(1)])
    assert (label.tier, label.source) == ("B", "shadow")
    assert label.correctness == {"C": True, "B": True}


def test_cheaper_shadow_with_another_answer_keeps_the_routed_tier() -> None:
    label = live_label(runs(("C", "Paris"), ("B", "Lyon")), [FeedbackVerdict(1)])
    assert label.tier == "C" and label.correctness["B"] is False


def test_thumbs_down_escalates_one_tier_below_c() -> None:
    assert live_label(runs(("A", "Lyon")), [FeedbackVerdict(-1)]).tier == "B"
    # B failed, C said something else (unknown): C may work.
    assert live_label(runs(("B", "Lyon"), ("C", "Nice")), [FeedbackVerdict(-1)]).tier == "C"


def test_never_escalates_past_a_failing_top_tier() -> None:
    # Only C is known to have failed: nothing is known about a cheaper tier.
    assert live_label(runs(("C", "Lyon")), [FeedbackVerdict(-1)]) is None
    assert live_label(runs(("C", "Lyon"), ("B", "Nice")), [FeedbackVerdict(-1)]) is None
    # B and C both failed (C said the same wrong thing): the same failure costs less at B.
    label = live_label(runs(("B", "Lyon"), ("C", "lyon.")), [FeedbackVerdict(-1)])
    assert label.tier == "B" and label.correctness == {"B": False, "C": False}


def test_correction_scores_every_run() -> None:
    feedback = [FeedbackVerdict(-1, correct_answer="Paris")]
    label = live_label(runs(("A", "Lyon"), ("B", "It is Paris")), feedback)
    assert (label.tier, label.source) == ("B", "shadow")  # Acc: the gold is in B's answer
    both_wrong = live_label(runs(("A", "Lyon"), ("B", "Nice")), feedback)
    assert both_wrong.tier == "C"  # B failed, C never ran: escalate
    every_tier_wrong = live_label(runs(("B", "Lyon"), ("C", "Nice")), feedback)
    assert every_tier_wrong.tier == "B"


def test_failed_run_counts_as_wrong_and_latest_rating_wins() -> None:
    label = live_label(runs(("B", None), ("C", None)), [FeedbackVerdict(1), FeedbackVerdict(-1)])
    assert label.tier == "B" and label.correctness == {"B": False, "C": False}


def test_neighbour_tiers() -> None:
    assert [SHADOW_TIER[t] for t in "ABC"] == ["B", "C", "B"]


# --- from the records (SQLite, real migrations) -----------------------------------------------------

def question_split(question: str) -> str:
    """The documented live split, written out independently of `live_split`: sha256 of
    "live-split:<casefolded, spaces collapsed, end punctuation stripped question>"."""
    normal = " ".join(question.lower().split()).strip("?!. ")
    digest = hashlib.sha256(f"live-split:{normal}".encode()).digest()
    return "train" if int.from_bytes(digest[:8], "big") / 2**64 < 0.6 else "test"


def _served(store, request_id: str, query: str, primary: tuple[str, str], shadow: tuple[str, str] | None = None) -> None:
    store.create_request(request_id, "acme", None, query)
    store.save_result(AnswerResult(request_id=request_id, tier=primary[0], strategy="s",
                                   answer=primary[1], steps=1), "w", 1)
    if shadow:
        store.save_result(AnswerResult(request_id=request_id, kind=ResultKind.SHADOW, tier=shadow[0],
                                       strategy="s", answer=shadow[1], steps=1), "w", 1)


def test_relabel_turns_feedback_into_live_labels_and_updates_on_rerun(tmp_path) -> None:
    from adaptive_rag.training.relabel import relabel_from_records
    from adaptive_rag.storage import LabelStore, make_engine, upgrade_database
    from adaptive_rag.storage.records import RecordStore

    url = f"sqlite:///{tmp_path / 'records.db'}"
    upgrade_database(url)
    store = RecordStore(make_engine(url))
    _served(store, "r1", "Compare X and Y", ("C", "X"), ("B", "x"))
    _served(store, "r4", "Hi there", ("A", "Hello"))
    _served(store, "r3", "No verdict", ("B", "Maybe"))
    store.add_feedback("r1", "acme", 1, None, None)
    store.add_feedback("r4", "acme", -1, None, "wrong")
    store.add_feedback("r3", "acme", 0, None, None)

    stats = relabel_from_records(store.engine)
    assert (stats.requests, stats.labelled, stats.unknown) == (3, 2, 1)
    labels = {row.question_id: row for row in LabelStore(store.engine).labels(split=None, origin="live")}
    assert (labels["r1"].label, labels["r1"].label_source, labels["r1"].dataset) == ("B", "shadow", "live:acme")
    assert labels["r4"].label == "B" and labels["r4"].question == "Hi there"
    # 60/40 by a hash of the normalised question (never of the request id).
    assert [question_split("Compare X and Y"), question_split("Hi there")] == ["test", "train"]
    assert (labels["r1"].split, labels["r4"].split) == ("test", "train")

    store.add_feedback("r4", "acme", 1, None, "actually fine")  # the latest verdict wins
    again = relabel_from_records(store.engine)
    assert (again.labelled, again.updated, again.unchanged) == (0, 1, 1)
    relabelled = {row.question_id: row.label for row in LabelStore(store.engine).labels(split=None, origin="live")}
    assert relabelled == {"r1": "B", "r4": "A"}


def test_a_repeated_question_lands_in_one_split_whatever_the_request(tmp_path) -> None:
    from adaptive_rag.storage import LabelStore, make_engine, upgrade_database
    from adaptive_rag.storage.records import RecordStore
    from adaptive_rag.training.relabel import relabel_from_records

    url = f"sqlite:///{tmp_path / 'records.db'}"
    upgrade_database(url)
    store = RecordStore(make_engine(url))
    spellings = ["How long is the Hub H2 warranty?", "how long is the hub h2 warranty", "  HOW long is the Hub H2 warranty ?!"]
    for n, query in enumerate(spellings * 4):
        request_id = f"q{n}"
        _served(store, request_id, query, ("B", "Two years"))
        store.add_feedback(request_id, "acme", 1, None, None)
    relabel_from_records(store.engine)
    rows = LabelStore(store.engine).labels(split=None, origin="live")
    assert len(rows) == 12 and {row.split for row in rows} == {question_split(spellings[0])}
    # A label stored under the old rule (by request id) is moved to its question's split.
    with store.engine.begin() as conn:
        from sqlalchemy import text

        other = "test" if question_split(spellings[0]) == "train" else "train"
        conn.execute(text("UPDATE training_labels SET split = :s WHERE question_id = 'q0'"), {"s": other})
    again = relabel_from_records(store.engine)
    assert again.resplit == 1 and again.labelled == 0
    assert {row.split for row in LabelStore(store.engine).labels(split=None, origin="live")} == {question_split(spellings[0])}


def test_a_label_the_records_no_longer_support_is_removed(tmp_path) -> None:
    from adaptive_rag.storage import LabelStore, make_engine, upgrade_database
    from adaptive_rag.storage.records import RecordStore
    from adaptive_rag.training.relabel import relabel_from_records

    url = f"sqlite:///{tmp_path / 'records.db'}"
    upgrade_database(url)
    store = RecordStore(make_engine(url))
    _served(store, "r1", "Compare X and Y", ("C", "X"))
    store.add_feedback("r1", "acme", 1, None, None)
    assert relabel_from_records(store.engine).labelled == 1
    store.add_feedback("r1", "acme", -1, None, "wrong after all")  # only C known wrong: no label
    again = relabel_from_records(store.engine)
    assert (again.unknown, again.removed) == (1, 1)
    assert LabelStore(store.engine).labels(split=None, origin="live") == []
