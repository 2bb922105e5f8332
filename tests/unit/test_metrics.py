"""SQuAD-normalised EM / F1 / Acc, max over gold aliases."""

from __future__ import annotations

import pytest

from adaptive_rag.evaluation.metrics import accuracy, exact_match, f1_score, normalize_answer, score


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Paris", "paris"),
        ("PARIS", "paris"),
        ("Paris!", "paris"),
        ("St. Louis, Missouri.", "st louis missouri"),
        ("The Beatles", "beatles"),
        ("a cat and an owl", "cat and owl"),
        ("  New \t York\n City  ", "new york city"),
        ("Theatre", "theatre"),  # 'the' inside a word is not an article
        ("anthem of a nation", "anthem of nation"),
        ("the the", ""),
        ("", ""),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_ignores_case_punctuation_articles_and_spacing() -> None:
    assert exact_match("  the  PARIS. ", ["Paris"]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0


def test_exact_match_takes_the_best_alias() -> None:
    assert exact_match("JFK", ["John F. Kennedy", "jfk"]) == 1.0
    assert exact_match("Kennedy", ["John F. Kennedy", "JFK"]) == 0.0


def test_f1_partial_overlap() -> None:
    # pred tokens {new, york}, gold {new, york, city}: P = 1, R = 2/3, F1 = 0.8
    assert f1_score("New York", ["New York City"]) == pytest.approx(0.8)


def test_f1_counts_repeated_tokens_once_per_occurrence() -> None:
    # pred [a, a, b] has common {a:1, b:1} with gold [a, b]: P = 2/3, R = 1, F1 = 0.8
    assert f1_score("x x y", ["x y"]) == pytest.approx(0.8)


def test_f1_is_max_over_aliases() -> None:
    golds = ["Barack Obama", "Obama", "Barack Hussein Obama II"]
    assert f1_score("Obama", golds) == pytest.approx(1.0)
    assert f1_score("president Obama", golds) == pytest.approx(2 / 3)  # best alias "Obama": P = 1/2, R = 1


def test_f1_no_overlap_is_zero() -> None:
    assert f1_score("London", ["Paris"]) == 0.0


@pytest.mark.parametrize("fn", [exact_match, f1_score, accuracy])
def test_empty_prediction_scores_zero(fn) -> None:
    assert fn("", ["Paris"]) == 0.0
    assert fn("   ", ["Paris"]) == 0.0


@pytest.mark.parametrize("fn", [exact_match, f1_score, accuracy])
def test_empty_gold_list_scores_zero(fn) -> None:
    assert fn("Paris", []) == 0.0


def test_accuracy_on_word_boundaries() -> None:
    assert accuracy("Paris, France", ["Paris"]) == 1.0
    assert accuracy("It is in Paris.", ["paris"]) == 1.0
    assert accuracy("a party", ["art"]) == 0.0
    assert accuracy("Parisian", ["Paris"]) == 0.0
    assert accuracy("New York City", ["York City"]) == 1.0


def test_accuracy_any_alias_suffices() -> None:
    assert accuracy("the band Queen", ["Freddie Mercury", "Queen"]) == 1.0
    assert accuracy("the band Queen", ["Freddie Mercury"]) == 0.0


def test_accuracy_ignores_golds_that_normalise_to_nothing() -> None:
    # "The" normalises to "", which would otherwise be "contained" in everything.
    assert accuracy("anything at all", ["The"]) == 0.0


def test_score_returns_all_three() -> None:
    assert score("The Eiffel Tower", ["Eiffel Tower"]) == {"em": 1.0, "f1": 1.0, "acc": 1.0}
    result = score("near the Eiffel Tower", ["Eiffel Tower"])
    assert result["em"] == 0.0
    assert result["acc"] == 1.0
    assert result["f1"] == pytest.approx(0.8)
