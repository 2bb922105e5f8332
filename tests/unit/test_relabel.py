"""Live labels from results, shadow runs and feedback."""

from __future__ import annotations

from adaptive_rag.classifier.relabel import FeedbackVerdict, TierRun, live_label, neighbour_tier


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


def test_thumbs_down_escalates_one_tier() -> None:
    assert live_label(runs(("A", "Lyon")), [FeedbackVerdict(-1)]).tier == "B"
    assert live_label(runs(("C", "Lyon")), [FeedbackVerdict(-1)]).tier == "C"  # nothing above C


def test_correction_scores_every_run() -> None:
    feedback = [FeedbackVerdict(-1, correct_answer="Paris")]
    label = live_label(runs(("A", "Lyon"), ("B", "It is Paris")), feedback)
    assert (label.tier, label.source) == ("B", "shadow")  # Acc: the gold is in B's answer
    both_wrong = live_label(runs(("A", "Lyon"), ("B", "Nice")), feedback)
    assert both_wrong.tier == "C"


def test_failed_run_counts_as_wrong_and_latest_rating_wins() -> None:
    label = live_label(runs(("B", None), ("C", None)), [FeedbackVerdict(1), FeedbackVerdict(-1)])
    assert label.tier == "C" and label.correctness == {"B": False, "C": False}


def test_neighbour_tiers() -> None:
    assert [neighbour_tier(t) for t in "ABC"] == ["B", "C", "B"]
