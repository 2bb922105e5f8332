"""One contract for every Retriever backend: the embedded tantivy index and OpenSearch.

`retriever_factory(passages)` builds a fresh index from `passages` and returns its retriever; the
same assertions then hold for both backends.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.ports import Retriever

pytestmark = pytest.mark.integration

Factory = Callable[[Sequence[Passage]], Retriever]

CORPUS = [
    Passage("paris", "Paris", "Paris is the capital and largest city of France, on the Seine."),
    Passage("berlin", "Berlin", "Berlin is the capital of Germany and its largest city."),
    Passage("cheese", "French cheese", "France produces hundreds of kinds of cheese such as brie."),
    Passage("seine", "Seine", "The Seine is a river in northern France that flows through Paris."),
    Passage("zebra", "Zebra", "An African equine with distinctive black and white stripes."),
    Passage("savanna", "Savanna", "Grassland where the zebra grazes beside antelope and giraffe."),
    Passage("cafe", "Café culture", "The café is central to social life in Vienna and Paris."),
    Passage("tokyo", "東京", "東京 is the capital of Japan. Tokyo Tower stands in Minato."),
    Passage("party", "Party emoji", "The 🎉 emoji is used to celebrate a party."),
    Passage("sql", "SQL", "WHICH GROUP IN WHICH order: SELECT AND OR NOT are SQL keywords."),
]
IDS = {p.id for p in CORPUS}

HOSTILE_QUERIES = [
    "WHICH GROUP IN WHICH",
    "a AND (b",
    '"unclosed',
    "title:x",
    "*~^!",
    "\\",
    "NOT OR AND",
    "{}[]",
    "/regex/",
    "capital of France " * 600,  # ~10 KB, repeated words
    " ".join(f"word{i}" for i in range(1500)),  # ~10 KB of distinct words
    "東" * 10_000,  # 10 KB of CJK: one token per character in OpenSearch
    "🎉" * 3000,  # 12 KB of emoji: one token each in OpenSearch
    "x" * 10_000,  # one enormous token
    "",
    " ",
    "\t\n  ",
    "capital\x00of\x00France",
    "+France -Germany",
    "France^10",
    "Par?s Par*",
    "(France OR Germany) AND NOT (capital",
    "title:Paris AND text:France",
    "'; DROP TABLE passages; --",
    "<script>alert(1)</script>",
    "%s %d {0} ${x}",
    "\u202e\u200b\ufeff",
    "🏳️‍🌈👨‍👩‍👧",
]


def _tantivy_factory(tmp_path: Path) -> Factory:
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    counter = iter(range(1_000_000))

    def make(passages: Sequence[Passage]) -> Retriever:
        return TantivyRetriever.build(tmp_path / f"index-{next(counter)}", passages)

    return make


@pytest.fixture(params=["tantivy", "opensearch"])
def retriever_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    if request.param == "tantivy":
        yield _tantivy_factory(tmp_path)
        return

    from adaptive_rag.retrieval.opensearch import OpenSearchRetriever

    url = request.getfixturevalue("opensearch_url")
    made: list[OpenSearchRetriever] = []

    def make(passages: Sequence[Passage]) -> Retriever:
        retriever = OpenSearchRetriever.create(url, f"arag-contract-{uuid.uuid4().hex[:12]}", passages)
        made.append(retriever)
        return retriever

    yield make
    for retriever in made:
        retriever.delete_index()
        retriever.close()


@pytest.fixture
def retriever(retriever_factory: Factory) -> Retriever:
    return retriever_factory(CORPUS)


def assert_well_formed(results: object, k: int, ids: set[str] = IDS) -> None:
    """At most k distinct known passages, each with its indexed title and text, by score."""
    assert isinstance(results, list)
    assert len(results) <= k
    by_id = {p.id: p for p in CORPUS}
    for passage in results:
        assert isinstance(passage, Passage)
        assert passage.id in ids
        if passage.id in by_id:
            assert (passage.title, passage.text) == (by_id[passage.id].title, by_id[passage.id].text)
        assert isinstance(passage.score, float)
    scores = [p.score for p in results]
    assert scores == sorted(scores, reverse=True)
    assert len({p.id for p in results}) == len(results)


# ---- shape ---------------------------------------------------------------------------------------


def test_is_a_retriever(retriever: Retriever) -> None:
    assert isinstance(retriever, Retriever)


# Passages holding at least one of the query's terms (capital, city, France; "of" is a stop word):
# BM25 scores every one of them above zero, and no other passage.
MATCHING_CAPITAL_CITY_FRANCE = {"paris", "berlin", "cheese", "seine", "tokyo"}


@pytest.mark.parametrize("k", [1, 2, 3, 5, 6, 100])
def test_result_shape(retriever: Retriever, k: int) -> None:
    results = retriever.search("capital city of France", k)
    assert_well_formed(results, k)
    # Exactly k results while at least k passages match; every match (and nothing else) beyond.
    assert len(results) == min(k, len(MATCHING_CAPITAL_CITY_FRANCE))
    assert {p.id for p in results} <= MATCHING_CAPITAL_CITY_FRANCE
    if k >= len(MATCHING_CAPITAL_CITY_FRANCE):
        assert {p.id for p in results} == MATCHING_CAPITAL_CITY_FRANCE
    assert results[0].id == "paris"  # the only passage with all three terms
    assert all(p.score > 0 for p in results)


def test_top_k_is_a_prefix_of_a_longer_ranking(retriever: Retriever) -> None:
    # Asking for fewer results cuts the same ranking; it does not pick other passages.
    full = [p.id for p in retriever.search("capital city of France", 100)]
    for k in (1, 2, 3, 4):
        assert [p.id for p in retriever.search("capital city of France", k)] == full[:k]


def test_passages_carry_title_and_text(retriever: Retriever) -> None:
    (top,) = retriever.search("Berlin Germany", 1)
    assert top == Passage("berlin", CORPUS[1].title, CORPUS[1].text, top.score)
    assert top.score > 0


def test_zero_or_negative_k_gives_nothing(retriever: Retriever) -> None:
    assert retriever.search("France", 0) == []
    assert retriever.search("France", -1) == []


def test_count(retriever: Retriever) -> None:
    assert retriever.count() == len(CORPUS)  # type: ignore[attr-defined]


# ---- hostile input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("query", HOSTILE_QUERIES, ids=lambda q: repr(q[:24]) + f"/{len(q)}")
def test_hostile_queries_never_raise(retriever: Retriever, query: str) -> None:
    assert_well_formed(retriever.search(query, 5), 5)


def test_whitespace_gives_nothing(retriever: Retriever) -> None:
    for query in ("", " ", "\t\n"):
        assert retriever.search(query, 5) == []


def test_operators_are_plain_words(retriever: Retriever) -> None:
    # Query-string syntax would read these as operators; as words they match the SQL passage.
    results = retriever.search("WHICH GROUP IN WHICH order SELECT", 3)
    assert results and results[0].id == "sql"


def test_long_query_still_finds_the_relevant_passage(retriever: Retriever) -> None:
    results = retriever.search("zebra stripes " + "lorem ipsum dolor " * 600, 3)
    assert_well_formed(results, 3)
    assert results and results[0].id == "zebra"


# ---- unicode ---------------------------------------------------------------------------------------


def test_accents(retriever: Retriever) -> None:
    results = retriever.search("café Vienna", 3)
    assert results and results[0].id == "cafe"


def test_cjk(retriever: Retriever) -> None:
    results = retriever.search("東京", 3)
    assert_well_formed(results, 3)
    assert results and results[0].id == "tokyo"


def test_emoji(retriever: Retriever) -> None:
    results = retriever.search("🎉 party", 3)
    assert_well_formed(results, 3)
    assert results and results[0].id == "party"


# ---- empty index -------------------------------------------------------------------------------------


def test_empty_index_returns_nothing(retriever_factory: Factory) -> None:
    empty = retriever_factory([])
    assert empty.search("capital of France", 5) == []
    assert empty.search("a AND (b", 5) == []
    assert empty.count() == 0  # type: ignore[attr-defined]


# ---- ranking sanity -----------------------------------------------------------------------------------


def test_obviously_relevant_passage_ranks_first(retriever: Retriever) -> None:
    assert retriever.search("What is the capital of Germany?", 3)[0].id == "berlin"
    assert retriever.search("river flowing through Paris", 3)[0].id == "seine"
    assert retriever.search("kinds of cheese like brie", 3)[0].id == "cheese"


def test_stemming_and_stop_words(retriever: Retriever) -> None:
    # "grazing" ~ "grazes", "the"/"of" are stop words: the savanna passage still wins.
    assert retriever.search("the grazing of the antelopes", 3)[0].id == "savanna"


def test_title_matters(retriever_factory: Factory) -> None:
    same_text = "A short note that mentions nothing else in particular."
    passages = [
        Passage("plain", "Miscellany", same_text + " Lighthouse."),
        Passage("titled", "Lighthouse", same_text + " Lighthouse."),
        Passage("other", "Harbour", "Boats in the harbour at night."),
    ]
    results = retriever_factory(passages).search("lighthouse", 3)
    assert [p.id for p in results[:2]] == ["titled", "plain"]
    assert results[0].score > results[1].score


def test_title_only_match_beats_text_only_match(retriever: Retriever) -> None:
    # "zebra" is the Zebra passage's title and a word of the Savanna passage's text.
    results = retriever.search("zebra", 2)
    assert [p.id for p in results] == ["zebra", "savanna"]
