"""Tier C's `evidence` strategy over a fake reader: one reader call on the gathered chain, the
shared abstention gate judged on the question's own retrieval, and B's evidence (said so in the
steps) whenever the input is degenerate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeLLM, FakeRetriever, make_passages

from adaptive_rag.contracts import StrategyName
from adaptive_rag.domain import Passage
from adaptive_rag.evidence import NEEDS_GRAPH
from adaptive_rag.evidence.graphs import EntityGraphs
from adaptive_rag.prompts import single_step as single_step_prompt
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import EvidenceRead, build_strategy
from adaptive_rag.strategies.abstention import BELOW_THRESHOLD, NO_PASSAGE, Abstention
from adaptive_rag.strategies.single_step import READER_FOUND_NONE
from tests.support.evidence_kb import KB, QUESTION



@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> TantivyRetriever:
    return TantivyRetriever.build(tmp_path_factory.mktemp("kb") / "index", KB)


class Listing(FakeRetriever):
    """A fake retriever that can also list its knowledge base (`evidence.graphs.GraphSource`)."""

    def __init__(self, corpus: list[Passage], hits: list[Passage] | None = None, name: str = "kb") -> None:
        super().__init__(corpus if hits is None else hits)
        self.corpus, self.name, self.version = corpus, name, "1"

    def corpus_id(self) -> str:
        return self.name

    def corpus_version(self) -> str:
        return self.version

    def corpus_passages(self) -> Iterator[Passage]:
        return iter(self.corpus)


def ids(passages: list[Passage]) -> list[str]:
    return [p.id for p in passages]


def strategy(retriever, llm, **options) -> EvidenceRead:
    options.setdefault("graphs", EntityGraphs(background=False))
    return EvidenceRead(retriever, llm, **options)


# --- the chain, read once -----------------------------------------------------------------------


def test_reads_the_chain_in_one_call(retriever) -> None:
    llm = FakeLLM(["Highgate Cemetery"])
    result = strategy(retriever, llm, gatherer="chain", budget=3).run(QUESTION)
    assert (result.strategy, result.answer, result.answerable) == (StrategyName.EVIDENCE, "Highgate Cemetery", True)
    assert len(llm.calls) == 1
    assert "His grave is in Highgate Cemetery" in llm.prompts[0]  # the bridge page B misses
    assert "pemberton" in ids(result.passages) and len(result.passages) <= 3
    assert any(line.startswith("entity graph: 6 passages") for line in result.trace), result.trace
    assert "gatherer chain, budget 3" in result.trace
    assert not any("fell back" in line for line in result.trace)
    assert result.steps >= 1 and {"retrieve", "generate", "total"} <= set(result.timings)


def test_the_reader_gets_the_chain_prompt_not_single_steps(retriever) -> None:
    llm = FakeLLM(["x"])
    strategy(retriever, llm, gatherer="bm25", budget=2).run(QUESTION)
    assert "A question may need two" in llm.prompts[0]
    assert single_step_prompt.PROMPT.completion.split("\n")[0] not in llm.prompts[0]


def test_with_a_sentence_budget_the_reader_gets_the_chain_s_best_sentences_only(retriever) -> None:
    whole, trimmed = FakeLLM(["x"]), FakeLLM(["x"])
    read_whole = strategy(retriever, whole, gatherer="chain", budget=3).run(QUESTION)
    read_trimmed = strategy(retriever, trimmed, gatherer="chain", budget=3, evidence_tokens=40).run(QUESTION)
    assert ids(read_trimmed.passages) == ids(read_whole.passages)  # the same chain, less of it read
    assert len(trimmed.prompts[0]) < len(whole.prompts[0])
    assert "[1]" in trimmed.prompts[0]  # still under the passages' numbers


@pytest.mark.parametrize("budget", [1, 2, 5])
def test_never_more_passages_than_the_budget(budget: int, retriever) -> None:
    result = strategy(retriever, FakeLLM(["x"]), budget=budget).run(QUESTION)
    assert 1 <= len(result.passages) <= budget


# --- degenerate input: B's evidence, said so ------------------------------------------------------


def test_a_retriever_that_cannot_list_its_passages_gets_b_evidence() -> None:
    port_only = FakeRetriever(make_passages(8))
    result = strategy(port_only, FakeLLM(["x"]), gatherer="ppr", budget=4).run("Who is p1?")
    assert ids(result.passages) == ids(make_passages(4))
    assert "entity graph: the retriever cannot list its passages" in result.trace
    assert any(line.startswith("fell back to B's evidence") for line in result.trace), result.trace


def test_without_graphs_configured_the_graph_gatherers_say_so() -> None:
    result = strategy(Listing(make_passages(6)), FakeLLM(["x"]), gatherer="links", graphs=None).run("p1?")
    assert "entity graph: none configured" in result.trace
    assert any(line.startswith("fell back to B's evidence") for line in result.trace)


def test_an_empty_graph_falls_back() -> None:
    hits = make_passages(3)
    result = strategy(Listing([], hits=hits), FakeLLM(["x"]), gatherer="ppr", budget=3).run("Title p1?")
    assert ids(result.passages) == ids(hits)
    assert "entity graph: 0 passages, 0 entities" in result.trace
    assert any("no entity graph" in line for line in result.trace)
    assert any(line.startswith("fell back to B's evidence") for line in result.trace)


@pytest.mark.parametrize("gatherer", ["bm25", "bridge", "links", "ppr", "parts", "focused", "chain"])
def test_one_document_knowledge_base(gatherer: str, tmp_path: Path) -> None:
    only = [Passage("only", "Bath", "Bath is a city.")]
    result = strategy(TantivyRetriever.build(tmp_path / "one", only), FakeLLM(["a city"]),
                      gatherer=gatherer).run("Where is Bath?")
    assert (result.answer, ids(result.passages)) == ("a city", ["only"])
    if gatherer != "bm25":
        assert any(line.startswith("fell back to B's evidence") for line in result.trace), result.trace


@pytest.mark.parametrize("question", ["", "zzqx unknownword"])
def test_nothing_retrieved_abstains_without_the_reader(question: str, retriever) -> None:
    llm = FakeLLM([])
    result = strategy(retriever, llm).run(question)
    assert (result.answerable, result.answer, result.abstain_reason) == (False, "", NO_PASSAGE)
    assert llm.calls == [] and result.trace


# --- abstention: the shared gate, on the question's own retrieval -----------------------------------


def scored(query: str, k: int) -> list[Passage]:
    """The question's own hits score 1; a bridge query (question + a passage) scores 100."""
    score = 1.0 if query == "Who founded Acme?" else 100.0
    return [Passage(f"{score:g}-{i}", f"T{i}", f"text {i} {query[-12:]}", score=score) for i in range(k)]


@pytest.mark.parametrize(("min_score", "abstains"), [(5.0, True), (0.5, False)])
def test_abstention_is_judged_on_the_question_hits(min_score: float, abstains: bool) -> None:
    llm = FakeLLM(["x"])
    result = strategy(FakeRetriever(scored), llm, gatherer="bridge", budget=4,
                      abstention=Abstention(min_score=min_score)).run("Who founded Acme?")
    # the bridge queries' passages score 100 and are among the evidence, yet do not count
    assert any(p.score == 100.0 for p in result.passages)
    assert result.answerable is not abstains
    assert (result.abstain_reason, len(llm.calls)) == ((BELOW_THRESHOLD, 0) if abstains else ("", 1))


def test_the_reader_may_abstain(retriever) -> None:
    llm = FakeLLM([single_step_prompt.NO_ANSWER_MARKER])
    result = strategy(retriever, llm, reader_abstains=True).run(QUESTION)
    assert (result.answerable, result.abstain_reason, result.answer) == (False, READER_FOUND_NONE, "")
    assert result.passages and single_step_prompt.NO_ANSWER_MARKER in llm.prompts[0]


# --- the factory -----------------------------------------------------------------------------------


def test_build_strategy_takes_the_settings_and_the_gate() -> None:
    settings = Settings(_env_file=None, evidence_gatherer="bridge", evidence_budget=3, reader_abstains=True,
                        evidence_read_tokens=200, evidence_compare_sides=True)
    wrapped = build_strategy(StrategyName.EVIDENCE, FakeRetriever(), FakeLLM(), settings,
                             Abstention(min_relevance=0.4))
    built = wrapped.whole  # a two-part question's parts are read on their own (`strategies.parts`)
    assert isinstance(built, EvidenceRead) and wrapped.abstention == Abstention(min_relevance=0.4)
    assert (built.gatherer, built.budget, built.reader_abstains, built.evidence_tokens) == ("bridge", 3, True, 200)
    assert built.compare_sides
    assert built.abstention == Abstention(min_relevance=0.4)
    assert built.graphs is not None


@pytest.mark.parametrize("overrides, expected", [
    ({"reader": "qwen-1.5b"}, 400),                                              # tuned for this reader
    ({"reader": "qwen-1.5b", "evidence_read_tokens": 0}, None),                  # set: the passages whole
    ({"reader": "qwen-1.5b", "llm_base_url": "http://127.0.0.1:9/v1"}, None),    # an endpoint: the default
    ({"reader": "gemma-270m"}, None),                                            # not tuned: the default
])
def test_how_much_evidence_reads_is_a_knob_tuned_per_reader(overrides: dict, expected: int | None) -> None:
    from adaptive_rag.settings import DEFAULT_KNOBS, strategy_knob

    settings = Settings(_env_file=None, **overrides)
    built = build_strategy(StrategyName.EVIDENCE, FakeRetriever(), FakeLLM(), settings).whole
    assert built.evidence_tokens == expected
    # A run records every knob (`arag eval`'s generator.json), so a change of it cannot resume old outcomes.
    assert "evidence_read_tokens" in DEFAULT_KNOBS and strategy_knob(settings, "evidence_read_tokens") == (expected or 0)


def test_which_gatherers_need_the_graph() -> None:
    assert NEEDS_GRAPH == {"links", "ppr", "chain"}


@pytest.mark.parametrize("multi_step", ["evidence"])
def test_evidence_can_be_tier_c(multi_step: str) -> None:
    from adaptive_rag.contracts import Tier
    from adaptive_rag.strategies import strategy_for_tier

    assert strategy_for_tier(Tier.C, Settings(_env_file=None, multi_step=multi_step)) == "evidence"
