"""The embedded tantivy retriever: hostile text never raises, ranking, persistence, errors."""

from __future__ import annotations

import shutil

import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.errors import IndexNotFoundError
from adaptive_rag.ports import Retriever
from adaptive_rag.retrieval.tantivy_index import MAX_QUERY_TERMS, TantivyRetriever

DOCS = [
    Passage("d-eiffel", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France."),
    Passage("d-marathon", "Marathon", "Runners ran the marathon; the fastest runner finished first."),
    Passage("d-jog", "Jogging", "She goes running every morning and runs along the river."),
    Passage("d-cafe", "Café culture", "A café in Zürich serves coffee and naïve art exhibitions."),
    Passage("d-tokyo", "東京タワー", "東京タワー is a communications tower in Minato, Tokyo."),
    Passage("d-beatles", "The Beatles", "The Beatles were an English rock band formed in Liverpool."),
    Passage("d-group", "Which group", "A music group is a band of musicians which performs together."),
    Passage("d-river", "Danube", "The Danube is the second-longest river in Europe."),
]

HOSTILE = [
    "WHICH GROUP released the album IN WHICH the song appears?",
    "a AND (b",
    '"unclosed',
    "title:x",
    "*~^!",
    "",
    "   \t\n  ",
    "(((((",
    "text:[a TO z]",
    "/regex.*/",
    "field:\"quoted phrase\"~3 OR NOT",
    "band^10 river~2",
    "\\",
    "AND OR NOT",
    "-+&&||!(){}[]^\"~*?:\\/",
    "\x00\x01 nul bytes",
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tantivy") / "index"
    TantivyRetriever.build(path, DOCS)
    return path


@pytest.fixture(scope="module")
def retriever(index_dir) -> TantivyRetriever:
    return TantivyRetriever(index_dir)


def ids(passages: list[Passage]) -> list[str]:
    return [p.id for p in passages]


def test_it_satisfies_the_port(retriever) -> None:
    assert isinstance(retriever, Retriever)
    assert retriever.count() == len(DOCS)


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_never_raise(retriever, query: str) -> None:
    results = retriever.search(query, 5)
    assert isinstance(results, list)
    assert len(results) <= 5
    assert all(isinstance(p, Passage) for p in results)


def test_operator_words_are_searched_as_words(retriever) -> None:
    hits = retriever.search("WHICH GROUP ... IN WHICH", 3)
    assert hits and hits[0].id == "d-group"


def test_ten_kilobytes_of_text(retriever) -> None:
    query = ("The Danube river flows through Europe, past lattice towers and rock bands. " * 140)[:10_240]
    assert len(query) == 10_240
    hits = retriever.search(query, 3)
    assert 1 <= len(hits) <= 3


def test_query_terms_are_bounded_and_distinct(retriever) -> None:
    query = " ".join(f"word{i}x" for i in range(500))
    terms = retriever.query_terms(query)
    assert len(terms) == MAX_QUERY_TERMS
    assert len(set(terms)) == len(terms)
    assert retriever.query_terms("Tower tower TOWERS") == ["tower"]


@pytest.mark.parametrize("query", ["", "   ", "*~^!", "the of and", "AND OR NOT"])
def test_queries_without_terms_give_empty_list(retriever, query: str) -> None:
    assert retriever.search(query, 5) == []


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("café Zürich", "d-cafe"),
        ("CAFÉ", "d-cafe"),  # lowercasing works beyond ASCII
        ("naïve", "d-cafe"),
        ("東京タワー", "d-tokyo"),
        ("Danube 🎉🚀", "d-river"),
    ],
)
def test_unicode_queries(retriever, query: str, expected: str) -> None:
    hits = retriever.search(query, 3)
    assert hits and hits[0].id == expected


def test_emoji_only_query_is_empty(retriever) -> None:
    assert retriever.search("🎉🚀😀", 5) == []


def test_no_accent_folding(retriever) -> None:
    # The analyzer has no ASCII folding (like OpenSearch's `english`): "cafe" is not "café".
    assert "d-cafe" not in ids(retriever.search("cafe", 5))


def test_empty_index_returns_nothing(tmp_path) -> None:
    empty = TantivyRetriever.build(tmp_path / "empty", [])
    assert empty.count() == 0
    assert empty.search("tower", 5) == []


@pytest.mark.parametrize("k", [0, -1])
def test_non_positive_k_returns_nothing(retriever, k: int) -> None:
    assert retriever.search("tower", k) == []


def test_k_bounds_results(retriever) -> None:
    assert len(retriever.search("tower band river runner", 1)) == 1
    assert len(retriever.search("tower band river runner", 2)) == 2


def test_k_larger_than_corpus(retriever) -> None:
    hits = retriever.search("tower", 1000)
    assert 1 <= len(hits) < len(DOCS)
    assert len(set(ids(hits))) == len(hits)


def test_relevant_document_ranks_first_with_scores_descending(retriever) -> None:
    hits = retriever.search("Where is the Eiffel Tower?", 5)
    assert hits[0].id == "d-eiffel"
    assert hits[0].title == "Eiffel Tower"
    assert "wrought-iron" in hits[0].text
    scores = [p.score for p in hits]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] > 0


def test_stemming_matches_inflections_not_irregular_forms(retriever) -> None:
    # Porter stemming: running -> run (matches "runs"/"running"), runners -> runner;
    # the irregular past "ran" is not reduced to "run".
    assert retriever.query_terms("running runners ran") == ["run", "runner", "ran"]
    assert ids(retriever.search("running", 5)) == ["d-jog"]
    assert ids(retriever.search("runner", 5)) == ["d-marathon"]
    assert ids(retriever.search("ran", 5)) == ["d-marathon"]


def test_stop_words_do_not_match(retriever) -> None:
    # "the" is in nearly every document; as a stop word it must not make them hits.
    assert retriever.search("the", 5) == []


def test_title_boost_changes_ranking(tmp_path) -> None:
    docs = [
        Passage("in-title", "Lighthouse", "A building on the coast guiding ships at night."),
        Passage(
            "in-text", "Coastal buildings",
            "The lighthouse, the lighthouse keeper and another lighthouse stand there.",
        ),
    ]
    unboosted = TantivyRetriever.build(tmp_path / "i", docs, title_boost=0.01)
    assert ids(unboosted.search("lighthouse", 2))[0] == "in-text"
    boosted = TantivyRetriever(tmp_path / "i", title_boost=20.0)
    assert ids(boosted.search("lighthouse", 2))[0] == "in-title"
    # The boost scales the title clause only: the text-only document's score is unchanged.
    low = {p.id: p.score for p in unboosted.search("lighthouse", 2)}
    high = {p.id: p.score for p in boosted.search("lighthouse", 2)}
    assert high["in-text"] == pytest.approx(low["in-text"])
    assert high["in-title"] > low["in-title"]


def test_missing_index_dir_raises(tmp_path) -> None:
    with pytest.raises(IndexNotFoundError, match="no tantivy index"):
        TantivyRetriever(tmp_path / "does-not-exist")


def test_directory_without_index_raises(tmp_path) -> None:
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("not an index")
    with pytest.raises(IndexNotFoundError):
        TantivyRetriever(tmp_path / "junk")


def test_reopen_from_disk_gives_same_results(tmp_path, retriever, index_dir) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(index_dir, copy)
    reopened = TantivyRetriever(copy)
    for query in ["Eiffel tower Paris", "rock band Liverpool", "river Europe", "running"]:
        first, second = retriever.search(query, 4), reopened.search(query, 4)
        assert ids(first) == ids(second)
        assert [p.score for p in first] == pytest.approx([p.score for p in second])


def test_build_replaces_existing_index(tmp_path) -> None:
    path = tmp_path / "idx"
    TantivyRetriever.build(path, DOCS)
    rebuilt = TantivyRetriever.build(path, DOCS[:2])
    assert rebuilt.count() == 2
    assert TantivyRetriever(path).search("Liverpool", 5) == []


def test_build_reports_progress(tmp_path) -> None:
    seen: list[int] = []
    TantivyRetriever.build(tmp_path / "p", DOCS, seen.append)
    assert sum(seen) == len(DOCS)


# --- rebuilding in place ---------------------------------------------------------------------------


def test_a_rebuild_in_place_never_shows_an_open_reader_a_partial_index(tmp_path) -> None:
    index_dir = tmp_path / "index"
    reader = TantivyRetriever.build(index_dir, DOCS)
    before = len(reader.search("tower marathon river band", 10))
    seen: list[int] = []

    def new_corpus():
        for i in range(30):
            if i % 10 == 0:  # mid-build, the reader searches (and reloads if meta.json changed)
                seen.append(len(reader.search("tower marathon river band", 10)))
            yield Passage(f"n{i}", f"Lake {i}", "A lake in the new corpus.")

    TantivyRetriever.build(index_dir, new_corpus())
    assert before > 0 and seen == [before] * 3  # the old index, whole, until the swap
    assert reader.count() == 30 and reader.search("lake", 3)  # then the new one, whole
    assert [p.name for p in tmp_path.iterdir()] == ["index"]  # nothing left beside it


def test_a_failed_rebuild_leaves_the_old_index(tmp_path) -> None:
    index_dir = tmp_path / "index"
    TantivyRetriever.build(index_dir, DOCS)

    def broken():
        yield Passage("n0", "Lake", "A lake.")
        raise OSError("corpus file vanished")

    with pytest.raises(OSError, match="vanished"):
        TantivyRetriever.build(index_dir, broken())
    assert TantivyRetriever(index_dir).count() == len(DOCS)
    assert [p.name for p in tmp_path.iterdir()] == ["index"]


def test_a_build_sweeps_what_a_killed_build_left_but_not_a_live_one(tmp_path) -> None:
    import os
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)  # exited and reaped: no process has this id now (barring reuse)
    index_dir = tmp_path / "index"
    abandoned = [tmp_path / f".index.building-{dead_pid}", tmp_path / f".index.retired-{dead_pid}"]
    live = tmp_path / f".index.building-{os.getppid()}"  # a build still running elsewhere
    other = tmp_path / f".other.building-{dead_pid}"  # another index's: not this build's to judge
    for leftover in (*abandoned, live, other):
        leftover.mkdir()
        (leftover / "meta.json").write_text("{}")

    TantivyRetriever.build(index_dir, DOCS)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["index", live.name, other.name])
