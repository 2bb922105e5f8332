"""The validation split carved from `train` and the live labels' train/test split: both by a
stable hash of the normalised question, so a repeated question never straddles two splits."""

from __future__ import annotations

import hashlib

import pytest

from adaptive_rag.training.splits import (
    LIVE_TRAIN_SHARE, VALIDATION_SHARE, live_split, normalise_question, partition, tier_counts,
    validation_part,
)

QUESTIONS = [f"How long is the warranty of product number {i}?" for i in range(4000)]


@pytest.mark.parametrize(("raw", "normal"), [
    ("Who wrote Dune?", "who wrote dune"),
    ("  who   WROTE\tdune  ", "who wrote dune"),
    ("¿Who wrote Dune?!...", "who wrote dune"),
    ('"Who wrote Dune?"', "who wrote dune"),
    ("What is 2+2?", "what is 2 2"),  # punctuation and symbols become spaces
    ("C++ vs. Java?", "c vs java"),
    ("Ｗｈｏ wrote Dune", "who wrote dune"),  # full-width letters (NFKC)
])
def test_normalisation_casefolds_collapses_spaces_and_drops_punctuation(raw, normal):
    assert normalise_question(raw) == normal


def test_normalised_duplicates_land_in_the_same_part_and_split():
    variants = ["Who wrote Dune?", "who wrote dune", "  WHO wrote   Dune ?!", '"who wrote dune"']
    for question in QUESTIONS[:200]:
        spellings = [question, question.upper(), f"  {question.lower()}  ", question.rstrip("?") + "!!"]
        assert len({validation_part(s) for s in spellings}) == 1
        assert len({live_split(s) for s in spellings}) == 1
    assert len({validation_part(v) for v in variants}) == 1
    assert len({live_split(v) for v in variants}) == 1


def test_about_a_fifth_is_validation_and_sixty_percent_of_live_labels_train():
    share = sum(validation_part(q) == "validation" for q in QUESTIONS) / len(QUESTIONS)
    assert VALIDATION_SHARE == 0.2 and abs(share - 0.2) < 0.02
    train = sum(live_split(q) == "train" for q in QUESTIONS) / len(QUESTIONS)
    assert LIVE_TRAIN_SHARE == 0.6 and abs(train - 0.6) < 0.025


def test_the_two_hashes_are_independent():
    """Validation is a fifth of `train` whatever the split: the salts differ."""
    train = [q for q in QUESTIONS if live_split(q) == "train"]
    test = [q for q in QUESTIONS if live_split(q) == "test"]
    for group in (train, test):
        share = sum(validation_part(q) == "validation" for q in group) / len(group)
        assert abs(share - 0.2) < 0.03


def test_the_rule_is_stable_and_documented():
    """Written out independently: sha256 of "<salt>:<normalised question>", first 8 bytes."""
    def fraction(question: str, salt: str) -> float:
        digest = hashlib.sha256(f"{salt}:{normalise_question(question)}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    for question in QUESTIONS[:300]:
        assert validation_part(question) == ("validation" if fraction(question, "validation") < 0.2 else "fit")
        assert live_split(question) == ("train" if fraction(question, "live-split") < 0.6 else "test")


def test_partition_keeps_every_row_once_and_counts_tiers():
    rows = [(q, "ABC"[i % 3]) for i, q in enumerate(QUESTIONS[:300])]
    fit, validation = partition(rows, lambda row: row[0])
    assert sorted(fit + validation) == sorted(rows)
    assert all(validation_part(q) == "validation" for q, _ in validation)
    assert all(validation_part(q) == "fit" for q, _ in fit)
    assert tier_counts(["A", "C", "C"]) == {"A": 1, "B": 0, "C": 2}


def test_live_labels_are_repeated_up_to_their_share_and_at_most_the_cap() -> None:
    from adaptive_rag.training.splits import MAX_LIVE_REPEATS, live_repeats, weighted_live

    assert live_repeats(10, 360, 0.2) == 9  # 90 of 450: a fifth
    assert live_repeats(30, 3300, 0.2) == MAX_LIVE_REPEATS
    assert live_repeats(0, 100) == 1 and live_repeats(10, 10, 0.2) == 1  # never fewer than once
    assert live_repeats(10, 360, 0.0) == 1
    rows = ["hotpotqa", "live:support", "squad"]
    assert weighted_live(rows, lambda r: r, 0.5) == ["hotpotqa", "live:support", "live:support", "squad"]
    assert weighted_live(["squad"], lambda r: r) == ["squad"]


def test_the_tenant_of_a_label_comes_from_its_live_dataset() -> None:
    from adaptive_rag.training.splits import live_group, validation_columns

    assert live_group("live:support") == "support" and live_group("squad") is None and live_group("live:") is None

    class Row:
        def __init__(self, question: str, label: str, dataset: str) -> None:
            self.question, self.label, self.dataset = question, label, dataset

    assert validation_columns([Row("q1", "B", "live:acme"), Row("q2", "C", "musique")]) == (
        ["q1", "q2"], ["B", "C"], ["acme", None])
