"""The evidence gatherers on a tiny knowledge base in a real tantivy index: what each one hands the
reader for a bridge question, and that degenerate input falls back to B's evidence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evidence import (
    GATHERERS,
    EntityGraph,
    EvidenceGatherer,
    Weights,
    make_gatherer,
    reciprocal_rank_fusion,
)
from adaptive_rag.evidence.graph import TitleMatcher, entity_key
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from adaptive_rag.routing.rules import question_parts
from tests.support.evidence_kb import KB, QUESTION
from tests.unit.fakes import FakeRetriever

# The first hop finds Charles Mathew's page, which names his father: the bridge passage.
BRIDGE = "pemberton"


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> TantivyRetriever:
    return TantivyRetriever.build(tmp_path_factory.mktemp("kb") / "index", KB)


@pytest.fixture(scope="module")
def graph() -> EntityGraph:
    return EntityGraph(KB)


def ids(passages: list[Passage]) -> list[str]:
    return [p.id for p in passages]


# --- the contract ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GATHERERS)
def test_every_gatherer_keeps_the_contract(name: str, retriever, graph) -> None:
    gatherer = make_gatherer(name, graph)
    assert isinstance(gatherer, EvidenceGatherer) and gatherer.name == name
    evidence = gatherer.gather(QUESTION, retriever, 3)
    assert 0 < len(evidence.passages) <= 3 and len(set(ids(evidence.passages))) == len(evidence.passages)
    assert evidence.steps and evidence.searches >= 1
    # a smaller budget is the same ranking cut shorter
    assert ids(gatherer.gather(QUESTION, retriever, 2).passages) == ids(evidence.passages)[:2]


def test_unknown_gatherer_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown evidence gatherer 'nope'"):
        make_gatherer("nope")


def test_bm25_is_b_retrieval(retriever) -> None:
    evidence = make_gatherer("bm25").gather(QUESTION, retriever, 5)
    assert ids(evidence.passages) == ids(retriever.search(QUESTION, 5))
    assert evidence.searches == 1 and not evidence.fallback
    assert BRIDGE not in ids(evidence.passages)  # the question alone misses the bridge page


# --- each gatherer finds the bridge page B misses --------------------------------------------------


# On six passages every hop finds every passage, so the bridge hop and the chain's fusion only add
# the bridge page after the first hop's; the graph's lists put it second.
@pytest.mark.parametrize(("name", "k"), [("bridge", 5), ("links", 2), ("ppr", 2), ("chain", 5)])
def test_gatherer_hands_the_reader_the_bridge_passage(name: str, k: int, retriever, graph) -> None:
    evidence = make_gatherer(name, graph).gather(QUESTION, retriever, k)
    assert {"mathew", BRIDGE} <= set(ids(evidence.passages)), evidence.steps
    assert not evidence.fallback


def test_bridge_queries_the_question_with_each_top_passage(retriever) -> None:
    recording = FakeRetriever(lambda query, k: retriever.search(query, k))
    evidence = make_gatherer("bridge").gather(QUESTION, recording, 3)
    first, *second = recording.query_texts
    assert first == QUESTION and len(second) == 3 == evidence.searches - 1
    assert second[0].startswith(QUESTION) and "Henry Walcot Pemberton" in second[0]


def test_links_follow_titles_the_first_hop_mentions(retriever, graph) -> None:
    evidence = make_gatherer("links", graph).gather(QUESTION, retriever, 6)
    assert any("links: 1 passages" in step or "links: 2 passages" in step for step in evidence.steps), evidence.steps
    assert BRIDGE in ids(evidence.passages)


def test_parts_retrieve_each_question_on_its_own() -> None:
    recording = FakeRetriever(lambda query, k: [Passage(query, query, query)])
    evidence = make_gatherer("parts").gather("What is X? And where is Y?", recording, 4)
    assert recording.query_texts == ["What is X? And where is Y?", "What is X?", "where is Y?"]
    assert set(ids(evidence.passages)) == {"What is X? And where is Y?", "What is X?", "where is Y?"}


@pytest.mark.parametrize(("query", "parts"), [
    ("What is X? And where is Y?", ["What is X?", "where is Y?"]),
    ("How long does it last, and what does it cost?", ["How long does it last", "what does it cost?"]),
    ("Who wrote Hamlet?", ["Who wrote Hamlet?"]),
])
def test_question_parts(query: str, parts: list[str]) -> None:
    assert question_parts(query) == parts


# --- degenerate input: B's evidence, said so --------------------------------------------------------


@pytest.mark.parametrize("name", ["links", "ppr", "chain"])
def test_without_a_graph_the_graph_gatherers_hand_b_evidence(name: str, retriever) -> None:
    for graph in (None, EntityGraph([])):
        evidence = make_gatherer(name, graph).gather("Where is Bath?", retriever, 2)
        if name == "chain":  # the bridge hop still runs
            assert evidence.passages
            continue
        assert ids(evidence.passages) == ids(retriever.search("Where is Bath?", 2))
        assert evidence.fallback and any("B's evidence" in s for s in evidence.steps)
        assert any("no entity graph" in s for s in evidence.steps)


@pytest.mark.parametrize("name", GATHERERS)
def test_one_document_knowledge_base(name: str, tmp_path: Path) -> None:
    only = [Passage("only", "Bath", "Bath is a city.")]
    retriever = TantivyRetriever.build(tmp_path / "one", only)
    evidence = make_gatherer(name, EntityGraph(only)).gather("Where is Bath?", retriever, 5)
    assert ids(evidence.passages) == ["only"]
    if name != "bm25":
        assert evidence.fallback and any("B's evidence" in s for s in evidence.steps)


@pytest.mark.parametrize("name", GATHERERS)
@pytest.mark.parametrize("question", ["", "???", "the of and", "zzqx unknownword"])
def test_questions_without_entities_or_hits_never_error(name: str, question: str, retriever, graph) -> None:
    evidence = make_gatherer(name, graph).gather(question, retriever, 5)
    assert ids(evidence.passages) == ids(retriever.search(question, 5))


def test_ppr_without_seeds_says_so(graph) -> None:
    evidence = make_gatherer("ppr", graph).gather("zzqx", FakeRetriever(), 5)
    assert evidence.passages == [] and evidence.fallback
    assert any("ppr: no seed" in s for s in evidence.steps)


# --- the graph and the fusion ------------------------------------------------------------------------


def test_title_matcher_matches_whole_words_longest_first() -> None:
    matcher = TitleMatcher([entity_key("Paris"), entity_key("Paris Hilton"), entity_key("Hilton (hotel)")])
    paris, paris_hilton, hilton = (matcher.keys[k] for k in (("paris",), ("paris", "hilton"), ("hilton",)))
    assert matcher.find("Parisian food; Paris Hilton's Hilton, and Paris.") == [paris_hilton, hilton, paris]
    assert matcher.find("") == []


def test_graph_links_titles_and_mentions(graph) -> None:
    assert ids(graph.linked(KB[0])) == [BRIDGE]
    assert graph.linked(KB[5]) == []
    assert graph.stats().passages == len(KB)
    # "Charles Mathew" is named by the question; "Burial" and "Father" are words of it too
    names = {" ".join(k) for k, e in graph.matcher.keys.items() if e in graph.question_entities(QUESTION)}
    assert "charles mathew" in names


def test_hub_entities_are_not_followed() -> None:
    passages = [Passage("hub", "London", "London is a city.")] + [
        Passage(f"p{i}", f"Person {i}", f"Person {i} lived in London.") for i in range(5)
    ]
    graph = EntityGraph(passages, max_mention_share=0.5, min_hub_passages=2)
    assert graph.stats().hubs == 1
    assert graph.linked(passages[1]) == []


def test_personalized_pagerank_is_a_distribution_reaching_two_hops(graph) -> None:
    mathew = graph.entity_node(graph.matcher.keys[("charles", "mathew")])
    scores = graph.personalized_pagerank({mathew: 1.0})
    assert scores.sum() == pytest.approx(1.0) and np.all(scores >= 0)
    passage_scores = scores[: len(graph)]
    reached = {graph.passages[n].id for n in np.nonzero(passage_scores)[0]}
    assert {"mathew", BRIDGE, "bath"} <= reached and "dickens" not in reached  # bath: a third hop
    assert passage_scores[graph.passage_node[BRIDGE]] > passage_scores[graph.passage_node["bath"]]
    assert graph.personalized_pagerank({}).sum() == 0


def test_reciprocal_rank_fusion_weighs_lists() -> None:
    a, b, c = (Passage(x, x, x) for x in "abc")
    assert ids(reciprocal_rank_fusion([([a, b], 1.0), ([b, c], 1.0)])) == ["b", "a", "c"]
    assert ids(reciprocal_rank_fusion([([a, b], 1.0), ([c], 1.0)])) == ["a", "c", "b"]
    assert ids(reciprocal_rank_fusion([([a, b], 3.0), ([c], 1.0)])) == ["a", "b", "c"]
    assert ids(reciprocal_rank_fusion([([a], 1.0), ([c], 0.0)])) == ["a"]


def test_weights_name_every_extra_list() -> None:
    assert set(Weights().extra()) == {"bridge", "links", "ppr", "parts"}
