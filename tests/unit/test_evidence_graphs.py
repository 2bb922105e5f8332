"""The entity graphs' lifecycle: built on first use (waiting or in the background), one build per
knowledge base at a time, invalidated when the knowledge base's version changes (never walked
stale), failures not retried until the next write, least recently used dropped; and the versions
the tantivy retrievers report change on every write."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.evidence.graph import EntityGraph
from adaptive_rag.evidence.graphs import EntityGraphs, GraphSource
from adaptive_rag.knowledge.indexes import TantivyKnowledgeIndex
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

KB = [
    Passage("a", "Alpha Centauri", "Alpha Centauri is near Proxima Centauri."),
    Passage("b", "Proxima Centauri", "Proxima Centauri is a red dwarf."),
]


class Source:
    """A knowledge base that lists its passages, with a version the test moves."""

    def __init__(self, passages: list[Passage], name: str = "kb") -> None:
        self.passages, self.name, self.version, self.listed = list(passages), name, "1", 0

    def corpus_id(self) -> str:
        return self.name

    def corpus_version(self) -> str:
        return self.version

    def corpus_passages(self) -> Iterator[Passage]:
        self.listed += 1
        return iter(list(self.passages))

    def search(self, query: str, k: int) -> list[Passage]:
        return self.passages[:k]


def test_a_source_is_a_graph_source(tmp_path: Path) -> None:
    assert isinstance(Source(KB), GraphSource)
    assert isinstance(TantivyRetriever.build(tmp_path / "i", KB), GraphSource)
    assert not isinstance(object(), GraphSource)


def test_built_once_per_version_and_rebuilt_after_a_write() -> None:
    graphs, source = EntityGraphs(background=False), Source(KB)
    first = graphs.lookup(source)
    assert first.graph is not None and len(first.graph) == 2
    assert first.note == "entity graph: 2 passages, 2 entities"
    assert graphs.lookup(source).graph is first.graph and graphs.builds == source.listed == 1
    source.passages.append(Passage("c", "Barnard's Star", "Barnard's Star is a red dwarf."))
    source.version = "2"
    second = graphs.lookup(source)
    assert second.graph is not first.graph and len(second.graph) == 3 and graphs.builds == 2


def test_in_the_background_a_request_never_waits_nor_walks_a_stale_graph() -> None:
    release, started = threading.Event(), threading.Event()

    def slow(passages: list[Passage]) -> EntityGraph:
        started.set()
        release.wait(5)
        return EntityGraph(passages)

    graphs, source = EntityGraphs(build=slow, background=True), Source(KB)
    pending = graphs.lookup(source)
    assert pending.graph is None and "being built" in pending.note
    assert started.wait(5)
    assert graphs.lookup(source).graph is None and graphs.builds == 1  # one build at a time
    release.set()
    assert graphs.warm(source).graph is not None
    source.version = "2"  # a write: the graph of version 1 is not handed out any more
    release.clear()
    assert graphs.lookup(source).graph is None and graphs.builds == 2
    release.set()
    assert len(graphs.warm(source).graph) == 2


def test_a_failed_build_is_not_retried_until_the_next_write() -> None:
    calls = []

    def failing(passages: list[Passage]) -> EntityGraph:
        calls.append(len(passages))
        raise RuntimeError("out of memory")

    graphs, source = EntityGraphs(build=failing, background=False), Source(KB)
    for _ in range(3):
        found = graphs.lookup(source)
        assert found.graph is None and "failed" in found.note
    assert calls == [2]
    source.version = "2"
    graphs.lookup(source)
    assert calls == [2, 2]


def test_least_recently_used_knowledge_base_dropped() -> None:
    graphs = EntityGraphs(max_graphs=2, background=False)
    a, b, c = Source(KB, "a"), Source(KB, "b"), Source(KB, "c")
    for source in (a, b, a, c):  # b is the least recently used when c comes
        graphs.lookup(source)
    assert graphs.builds == 3
    graphs.lookup(a)
    assert graphs.builds == 3
    graphs.lookup(b)
    assert graphs.builds == 4


def test_a_retriever_that_cannot_list_gets_no_graph() -> None:
    found = EntityGraphs(background=False).lookup(object())
    assert found.graph is None and "cannot list its passages" in found.note


# --- the versions tantivy reports ------------------------------------------------------------------


def test_tantivy_lists_every_passage_and_versions_every_commit(tmp_path: Path) -> None:
    retriever = TantivyRetriever.build(tmp_path / "i", KB)
    assert sorted(p.id for p in retriever.corpus_passages()) == ["a", "b"]
    versions = [retriever.corpus_version()]
    retriever.upsert([Passage("c", "Barnard's Star", "A red dwarf.")])
    versions.append(retriever.corpus_version())
    retriever.delete(["a"])
    versions.append(retriever.corpus_version())
    assert len(set(versions)) == 3
    assert sorted(p.id for p in retriever.corpus_passages()) == ["b", "c"]
    assert retriever.corpus_id() == TantivyRetriever(tmp_path / "i").corpus_id()


def test_a_tenant_graph_follows_import_upsert_delete_and_rebuild(tmp_path: Path) -> None:
    kb = TantivyKnowledgeIndex(tmp_path / "kb")
    kb.rebuild("acme", KB)
    retriever, graphs = kb.retriever("acme"), EntityGraphs(background=False)
    assert len(graphs.lookup(retriever).graph) == 2
    kb.upsert("acme", [Passage("c", "Barnard's Star", "A red dwarf near Proxima Centauri.")])
    assert len(graphs.lookup(retriever).graph) == 3
    kb.delete("acme", ["a"])
    graph = graphs.lookup(retriever).graph
    assert sorted(p.id for p in graph.passages) == ["b", "c"]
    kb.rebuild("acme", [Passage("z", "Zeta", "Zeta only.")])
    assert [p.id for p in graphs.lookup(retriever).graph.passages] == ["z"]
    assert graphs.builds == 4


@pytest.mark.parametrize("empty", [True])
def test_an_empty_listing_builds_an_empty_graph(empty: bool) -> None:
    found = EntityGraphs(background=False).lookup(Source([]))
    assert found.graph is not None and len(found.graph) == 0


# --- the version OpenSearch reports (the parsing; tests/integration runs it on a real cluster) ------


class _Indices:
    def __init__(self, stats: dict) -> None:
        self.stats_reply, self.asked = stats, []

    def stats(self, **params: object) -> dict:
        self.asked.append(params)
        return self.stats_reply


class _Client:
    def __init__(self, stats: dict) -> None:
        self.indices = _Indices(stats)


def _stats(uuid: str, *max_seq_nos: int) -> dict:
    shards = {str(n): [{"seq_no": {"max_seq_no": seq}}] for n, seq in enumerate(max_seq_nos)}
    return {"indices": {"kb-acme-g2": {"uuid": uuid, "shards": shards}}}


def test_opensearch_version_is_the_live_index_and_its_sequence_numbers() -> None:
    from adaptive_rag.retrieval.opensearch import OpenSearchRetriever

    def version(stats: dict) -> str:
        client = _Client(stats)
        retriever = OpenSearchRetriever("http://user:secret@127.0.0.1:9200", "kb-acme", client=client)
        assert client.indices.asked == [] and "secret" not in retriever.corpus_id()
        found = retriever.corpus_version()
        assert client.indices.asked == [{"index": "kb-acme", "metric": "docs", "level": "shards"}]
        return found

    first = version(_stats("u1", 10, 4))
    assert first == "kb-acme-g2:u1:10,4"
    assert version(_stats("u1", 11, 4)) != first  # a write on a shard
    assert version(_stats("u2", 10, 4)) != first  # a rebuild: another index behind the alias
    assert version({"indices": {}}) == "-"
