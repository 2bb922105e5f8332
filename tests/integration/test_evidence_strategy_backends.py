"""Tier C's `evidence` strategy on real indexes (the reader is a fake: what is checked is what it
is handed).

- On a tenant's knowledge base in both backends (embedded tantivy, a real OpenSearch): the
  graph-walking gatherer hands the reader the bridge page the question alone misses, and the
  entity graph follows the knowledge base through upsert, delete and rebuild (never handing a
  deleted passage; after a write it is updated, only the passages the write touches matched again).
- On the benchmark corpus in a real tantivy index: the `chain` gatherer hands the reader every
  supporting passage of 2Wiki `train` questions far more often than B's retrieval does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.evidence.graphs import EntityGraphs
from adaptive_rag.knowledge.documents import KnowledgeIndex
from adaptive_rag.knowledge.indexes import OpenSearchKnowledgeIndex, TantivyKnowledgeIndex
from adaptive_rag.strategies import EvidenceRead, SingleStep
from tests.unit.fakes import FakeLLM

pytestmark = pytest.mark.integration

KB = [
    Passage("mathew#0", "Charles Mathew", "Charles Mathew was an English actor, the son of Henry Walcot Pemberton.", doc_id="mathew"),
    Passage("pemberton#0", "Henry Walcot Pemberton (bookseller)", "Henry Walcot Pemberton kept a shop in Bath. His grave is in Highgate Cemetery.", doc_id="pemberton"),
    Passage("dickens#0", "Charles Dickens", "Charles Dickens was a writer; his father John was buried in London.", doc_id="dickens"),
    Passage("brady#0", "Mathew Brady", "Mathew Brady was buried in Washington; his father was a farmer.", doc_id="brady"),
    Passage("darwin#0", "Charles Darwin", "Charles Darwin's father Robert was buried at Shrewsbury.", doc_id="darwin"),
    Passage("bath#0", "Bath", "Bath is a city in Somerset with Roman baths.", doc_id="bath"),
]
QUESTION = "Where was the father of Charles Mathew buried?"


@pytest.fixture(params=["tantivy", "opensearch"])
def kb(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KnowledgeIndex]:
    if request.param == "tantivy":
        yield TantivyKnowledgeIndex(tmp_path / "kb")
        return
    url = request.getfixturevalue("opensearch_url")
    prefix = f"arag-evidence-{uuid.uuid4().hex[:8]}"
    index = OpenSearchKnowledgeIndex(url, prefix, old_index_grace_s=0.2)
    yield index
    names = list(index._client.indices.get(index=f"{prefix}-*", params={"expand_wildcards": "all"}))
    if names:
        index._client.indices.delete(index=",".join(names))
    index.close()


def ids(passages: list[Passage]) -> list[str]:
    return [p.id for p in passages]


def test_the_reader_gets_the_bridge_page_on_either_backend(kb: KnowledgeIndex) -> None:
    kb.rebuild("acme", KB)
    retriever = kb.retriever("acme")
    b = SingleStep(retriever, FakeLLM(["x"]), top_k=2).run(QUESTION)
    assert "pemberton#0" not in ids(b.passages)  # the question alone misses it
    llm = FakeLLM(["Highgate Cemetery"])
    result = EvidenceRead(retriever, llm, gatherer="links", budget=2,
                          graphs=EntityGraphs(background=False)).run(QUESTION)
    assert "pemberton#0" in ids(result.passages) and len(result.passages) == 2, result.trace
    assert "His grave is in Highgate Cemetery" in llm.prompts[0] and len(llm.calls) == 1
    assert "entity graph: 6 passages, 6 entities" in result.trace


def test_the_focused_hop_finds_the_bridge_page_on_either_backend(kb: KnowledgeIndex) -> None:
    # its query (the question's rest and the names the first hop mentions) needs no graph
    kb.rebuild("acme", [*KB, Passage("syntax#0", "Query: syntax (AND) \"OR\"", "O'Brien-Smith [NOT] A. B. *",
                                     doc_id="syntax")])
    retriever = kb.retriever("acme")
    assert "pemberton#0" not in ids(retriever.search(QUESTION, 10))
    result = EvidenceRead(retriever, FakeLLM(["x"]), gatherer="focused", budget=5).run(QUESTION)
    assert "pemberton#0" in ids(result.passages), result.trace
    # query syntax in a question and in the passage its names come from is only words
    hostile = EvidenceRead(retriever, FakeLLM(["x"]), gatherer="focused", budget=5).run(
        "Who is O'Brien-Smith (AND) \"NOT\" A. B.?")
    assert hostile.answer == "x" and "syntax#0" in ids(hostile.passages), hostile.trace
    assert any(line.startswith("focused:") for line in hostile.trace), hostile.trace


def test_the_graph_follows_upsert_delete_and_rebuild(kb: KnowledgeIndex) -> None:
    kb.rebuild("acme", KB)
    retriever, graphs = kb.retriever("acme"), EntityGraphs(background=False)
    strategy = EvidenceRead(retriever, FakeLLM(lambda prompt: "x"), gatherer="links", budget=3, graphs=graphs)
    assert "pemberton#0" in ids(strategy.run(QUESTION).passages)
    kb.delete("acme", ["pemberton#0"])
    result = strategy.run(QUESTION)
    assert "pemberton#0" not in ids(result.passages)  # invalidated, not walked stale
    assert "entity graph: 5 passages, 5 entities" in result.trace
    assert graphs.lookup(retriever).graph.rematched == 1  # updated: only Mathew's page named the deleted title
    kb.upsert("acme", [Passage("pemberton#1", "Henry Walcot Pemberton", "Pemberton lies in Kensal Green Cemetery.",
                               doc_id="pemberton")])
    assert "pemberton#1" in ids(strategy.run(QUESTION).passages)
    assert graphs.lookup(retriever).graph.rematched == 2  # the new page and the one naming its title
    kb.rebuild("acme", KB[:1])
    result = strategy.run(QUESTION)
    assert ids(result.passages) == ["mathew#0"] and any("fell back" in line for line in result.trace)
    assert graphs.builds == 4


# --- the benchmark corpus in a real tantivy index ----------------------------------------------------


@pytest.fixture(scope="module")
def benchmark(tmp_path_factory: pytest.TempPathFactory):
    from adaptive_rag.evaluation.corpus import load_corpus
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
    from adaptive_rag.settings import Settings

    settings = Settings()
    passages = load_corpus(settings.data_dir)
    retriever = TantivyRetriever.build(tmp_path_factory.mktemp("benchmark") / "index", passages,
                                       title_boost=settings.title_boost)
    return settings, retriever


def test_chain_hands_the_whole_chain_more_often_than_b(benchmark) -> None:
    from adaptive_rag.evaluation.datasets import load_questions

    settings, retriever = benchmark
    questions = [q for q in load_questions(settings.data_dir, ["2wiki"], split="train")][:40]
    graphs = EntityGraphs(background=False)
    complete = {"b": 0, "evidence": 0}
    for question in questions:
        b = SingleStep(retriever, FakeLLM(["x"]), top_k=5).run(question.question)
        c = EvidenceRead(retriever, FakeLLM(["x"]), gatherer="chain", budget=5, graphs=graphs).run(question.question)
        for name, result in (("b", b), ("evidence", c)):
            complete[name] += set(question.supporting_titles) <= {p.title for p in result.passages}
        assert len(c.passages) <= 5 and c.answer == "x"
    assert graphs.builds == 1
    # reports/evidence/ (all of train): 81.8 % against B's 34.4 %
    assert complete["evidence"] >= complete["b"] + 8, complete
