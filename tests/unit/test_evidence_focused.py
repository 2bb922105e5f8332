"""The focused second hop: a query per first-hop passage made of the question's rest and the names
that passage mentions, whose best hit takes the last of B's five places."""

from __future__ import annotations

import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.evidence import EntityGraph, FusedEvidence, Weights, make_gatherer
from adaptive_rag.evidence.gatherers import FOCUSED_END, focused_query, names, place_focused
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from tests.support.evidence_kb import KB, QUESTION
from tests.unit.fakes import FakeRetriever


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> TantivyRetriever:
    return TantivyRetriever.build(tmp_path_factory.mktemp("kb") / "index", KB)


def ids(passages: list[Passage]) -> list[str]:
    return [p.id for p in passages]


def lettered(letters: str) -> list[Passage]:
    return [Passage(x, x, x) for x in letters]


@pytest.mark.parametrize(("text", "exclude", "expected"), [
    (KB[0].text, QUESTION, ["English", "Henry Walcot Pemberton"]),
    ("The Battle of Hastings was fought in 1066. In England, Harold died.", "",
     ["Battle of Hastings", "England", "Harold"]),  # "The", "In": no name
    ("He met Anne. Anne met him; The End.", "", ["Anne", "End"]),  # once each, not across a stop
    ("A. P. J. Abdul Kalam won it.", "", ["A. P. J. Abdul Kalam"]),
    ("all lower case text", "", []),
    ("", "", []),
])
def test_names_are_runs_of_capitalised_words(text: str, exclude: str, expected: list[str]) -> None:
    assert names(text, exclude) == expected


def test_the_focused_query_is_the_question_rest_and_the_passage_names() -> None:
    # the seed's title words and stop words leave the question; the names the question has stay out
    assert focused_query(QUESTION, KB[0]) == "father buried English Henry Walcot Pemberton"
    assert focused_query("", Passage("x", "X", "")) == ""


@pytest.mark.parametrize(("focused", "places", "expected"), [
    ("x", 1, "abcdxefg"),
    ("xcy", 2, "abcxydefg"),      # c is already ranked before the places: skipped
    ("xyz", 1, "abcdxefg"),       # one place: the first hop's first passage's hit
    ("", 2, "abcdefg"),
    ("abc", 2, "abcdefg"),        # nothing new: the ranking as it was
    ("g", 1, "abcdgef"),          # a hit ranked lower moves up, once
])
def test_focused_hits_take_the_places_before_rank_five(focused: str, places: int, expected: str) -> None:
    ranking = lettered("abcdefg")
    placed = place_focused(ranking, lettered(focused), places)
    assert "".join(ids(placed)) == expected
    assert len(placed) == len({p.id for p in placed})


def test_a_short_ranking_takes_the_hit_after_it() -> None:
    assert "".join(ids(place_focused(lettered("ab"), lettered("x"), 2))) == "abx"
    assert FOCUSED_END == 5


def test_the_focused_gatherer_hands_the_bridge_page_the_question_misses(retriever) -> None:
    # BM25 for the question never reaches the father's page (no shared word); the focused query
    # from Charles Mathew's page names him
    assert "pemberton" not in ids(retriever.search(QUESTION, 10))
    evidence = FusedEvidence("focused", Weights(first=1.0, focused=1)).gather(QUESTION, retriever, 5)
    assert "pemberton" in ids(evidence.passages) and not evidence.fallback
    assert any(step.startswith("focused:") for step in evidence.steps)


def test_one_focused_query_per_top_first_hop_passage(retriever) -> None:
    recording = FakeRetriever(lambda query, k: retriever.search(query, k))
    evidence = make_gatherer("focused").gather(QUESTION, recording, 5)
    first, *focused = recording.query_texts
    top = retriever.search(QUESTION, 3)
    assert first == QUESTION and focused == [focused_query(QUESTION, seed) for seed in top]
    assert evidence.searches == 1 + len(top)


def test_the_chain_with_focused_places_keeps_the_budget_contract(retriever) -> None:
    gatherer = FusedEvidence("chain", Weights(first=1.0, links=0.5, ppr=0.5, parts=1.0, focused=2),
                             graph=EntityGraph(KB))
    longest = ids(gatherer.gather(QUESTION, retriever, 8).passages)
    for k in range(1, 8):
        assert ids(gatherer.gather(QUESTION, retriever, k).passages) == longest[:k]
