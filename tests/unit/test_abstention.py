"""Abstention (support semantics): nothing retrieved always abstains; below a threshold (raw BM25,
or relevance) the LLM is not called, in single step and in both multi-step strategies; with the
abstaining reader, its no-answer marker abstains. Thresholds off by default: unchanged tier B."""

from __future__ import annotations

import pytest
from fakes import FakeLLM, FakeRetriever

from adaptive_rag.domain import Passage
from adaptive_rag.prompts import format_passages
from adaptive_rag.prompts import single_step as prompt
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import Abstention, Decompose, IRCoT, SingleStep, build_strategy
from adaptive_rag.strategies.abstention import BELOW_THRESHOLD, NO_PASSAGE
from adaptive_rag.strategies.single_step import READER_FOUND_NONE, says_no_answer


class WeighingRetriever(FakeRetriever):
    """A fake retriever that weighs every query at `weight` (`ports.QueryWeigher`)."""

    def __init__(self, passages: list[Passage], weight: float) -> None:
        super().__init__(passages)
        self.weight = weight

    def query_weight(self, query: str) -> float:
        return self.weight


def scored(*scores: float) -> list[Passage]:
    return [Passage(id=f"d{i}#0", title=f"T{i}", text=f"text {i}", score=s, doc_id=f"d{i}")
            for i, s in enumerate(scores)]


def test_defaults_keep_the_plain_reader_and_never_abstain() -> None:
    llm, passages = FakeLLM(["Answer: the Danube"]), scored(0.1, 0.05)
    result = SingleStep(FakeRetriever(passages), llm).run("which river?")
    assert (result.answer, result.answerable, result.abstain_reason) == ("the Danube", True, "")
    assert llm.prompts == [prompt.PROMPT.text(passages=format_passages(passages), question="which river?")]
    assert prompt.NO_ANSWER_MARKER not in llm.prompts[0]


@pytest.mark.parametrize("abstention", [Abstention(), Abstention(min_score=4.0), Abstention(min_relevance=0.5)])
def test_nothing_retrieved_always_abstains_whatever_the_thresholds(abstention: Abstention) -> None:
    llm = FakeLLM([])  # the reader would answer from its own memory: any call fails the test
    result = SingleStep(WeighingRetriever([], 3.0), llm, abstention=abstention).run("capital of France?")
    assert (result.answerable, result.answer, result.abstain_reason) == (False, "", NO_PASSAGE)
    assert llm.calls == [] and result.passages == []


@pytest.mark.parametrize("passages", [scored(3.0, 2.5), scored(0.0)])
def test_below_the_threshold_abstains_without_calling_the_llm(passages: list[Passage]) -> None:
    llm = FakeLLM([])  # any call fails the test
    result = SingleStep(FakeRetriever(passages), llm, abstention=Abstention(min_score=4.0)).run("who won in 1972?")
    assert not result.answerable
    assert result.abstain_reason == BELOW_THRESHOLD == "no passage above the retrieval threshold"
    assert result.answer == "" and result.steps == 1 and llm.calls == []
    assert result.passages == passages  # kept for the record and the sources
    assert "retrieve" in result.timings and "generate" not in result.timings


@pytest.mark.parametrize("scores", [(4.0,), (1.0, 9.5), (4.0001, 0.0)])
def test_one_passage_at_or_above_the_threshold_is_enough(scores: tuple[float, ...]) -> None:
    llm = FakeLLM(["42"])
    result = SingleStep(FakeRetriever(scored(*scores)), llm, abstention=Abstention(min_score=4.0)).run("q?")
    assert result.answerable and result.answer == "42" and len(llm.calls) == 1


@pytest.mark.parametrize(
    "reply", ["not in the passages", "Not in the passages.", "Answer: NOT IN THE PASSAGES", "It is not in the passages!"]
)
def test_the_reader_marker_abstains(reply: str) -> None:
    llm = FakeLLM([reply])
    result = SingleStep(FakeRetriever(scored(5.0)), llm, reader_abstains=True).run("q?")
    assert not result.answerable
    assert result.abstain_reason == READER_FOUND_NONE == "the reader found no answer in the passages"
    assert result.answer == ""
    assert "If the passages above do not answer the question" in llm.prompts[0]
    assert llm.calls[0].max_tokens == prompt.PROMPT.max_tokens and llm.calls[0].stop == prompt.PROMPT.stop


def test_the_abstaining_reader_still_answers_when_it_can() -> None:
    llm = FakeLLM(["the Danube"])
    result = SingleStep(FakeRetriever(scored(5.0)), llm, reader_abstains=True).run("which river?")
    assert result.answerable and result.answer == "the Danube"
    assert prompt.NO_ANSWER_MARKER in llm.prompts[0] and "which river?" in llm.prompts[0]


def test_without_reader_abstention_the_marker_is_just_an_answer() -> None:
    result = SingleStep(FakeRetriever(scored(5.0)), FakeLLM(["not in the passages"])).run("q?")
    assert result.answerable and result.answer == "not in the passages"


def test_threshold_is_checked_before_the_reader() -> None:
    llm = FakeLLM([])
    result = SingleStep(FakeRetriever(scored(1.0)), llm, abstention=Abstention(min_score=2.0),
                        reader_abstains=True).run("q?")
    assert result.abstain_reason == BELOW_THRESHOLD and llm.calls == []


def test_says_no_answer_needs_the_marker_words_in_order() -> None:
    assert says_no_answer("...not in the passages")
    assert not says_no_answer("not in the passage list")
    assert not says_no_answer("the passages")
    assert not says_no_answer("")


def test_abstain_prompt_is_a_separate_constant_with_both_placeholders() -> None:
    assert prompt.ABSTAIN != prompt.PROMPT
    text = prompt.ABSTAIN.text(passages="[1] T: x", question="Q?")
    assert text.startswith("[1] T: x") and text.endswith("Question: Q?\nAnswer:")
    assert text.count(prompt.NO_ANSWER_MARKER) == 2  # the instruction and the worked example


# --- relevance: the best score over the question's weight ---------------------------------------


@pytest.mark.parametrize(("scores", "answered"), [((2.0, 9.0), True), ((5.0,), True), ((4.9, 1.0), False)])
def test_relevance_below_the_threshold_abstains_and_says_how_far(scores: tuple[float, ...], answered: bool) -> None:
    llm = FakeLLM(["42"])
    retriever = WeighingRetriever(scored(*scores), weight=10.0)  # relevance = best score / 10
    result = SingleStep(retriever, llm, abstention=Abstention(min_relevance=0.5)).run("q?")
    assert result.answerable is answered
    if not answered:
        assert llm.calls == [] and result.passages == scored(*scores)  # the closest sources kept
        assert result.abstain_reason == ("the knowledge base does not cover the question: the closest "
                                         "passage's relevance 0.49 is below its threshold 0.50")


def test_a_retriever_that_cannot_weigh_queries_is_judged_on_raw_scores_only() -> None:
    result = SingleStep(FakeRetriever(scored(0.01)), FakeLLM(["42"]), abstention=Abstention(min_relevance=5.0)).run("q?")
    assert result.answerable and result.answer == "42"


def test_ircot_abstains_on_its_first_retrieval_before_any_generation() -> None:
    llm = FakeLLM([])
    retriever = WeighingRetriever(scored(1.0, 0.5), weight=10.0)
    result = IRCoT(retriever, llm, max_steps=3, abstention=Abstention(min_relevance=0.3)).run("who and where?")
    assert (result.answerable, result.steps, llm.calls) == (False, 1, [])
    assert "relevance 0.10" in result.abstain_reason and [p.id for p in result.passages] == ["d0#0", "d1#0"]
    assert retriever.query_texts == ["who and where?"]


def test_ircot_with_nothing_retrieved_abstains() -> None:
    result = IRCoT(FakeRetriever([]), FakeLLM([]), max_steps=3).run("who and where?")
    assert (result.answerable, result.abstain_reason) == (False, NO_PASSAGE)


def test_decompose_abstains_on_the_questions_own_retrieval_before_splitting_it() -> None:
    llm = FakeLLM([])  # no split is generated
    retriever = WeighingRetriever(scored(1.0, 0.9, 0.8), weight=10.0)
    result = Decompose(retriever, llm, top_k=2, abstention=Abstention(min_relevance=0.3)).run("X? And Y?")
    assert (result.answerable, result.steps, llm.calls) == (False, 1, [])
    assert [p.id for p in result.passages] == ["d0#0", "d1#0"]  # the question's top_k, for the agent
    assert retriever.queries == [("X? And Y?", 3)]


def test_decompose_above_the_threshold_splits_and_keeps_the_questions_hits_first() -> None:
    llm = FakeLLM(["How long is the warranty?\nHow long do refunds take?", "2 years; 5 days"])
    retriever = WeighingRetriever(scored(9.0, 8.0, 7.0), weight=10.0)
    question = "How long are the warranty and the refunds?"
    result = Decompose(retriever, llm, top_k=5, max_passages=8, abstention=Abstention(min_relevance=0.3)).run(question)
    assert result.answerable and result.answer == "2 years; 5 days" and result.steps == 3
    assert retriever.queries[0] == (question, 6) and len(llm.calls) == 2


def test_build_strategy_wires_the_settings(settings: Settings) -> None:
    retriever, llm = FakeRetriever([]), FakeLLM([])
    plain = build_strategy("single_step", retriever, llm, settings)
    assert (plain.abstention, plain.reader_abstains) == (Abstention(), False)
    tuned = build_strategy(
        "single_step", retriever, llm,
        Settings(_env_file=None, abstain_min_score=7.5, abstain_min_relevance=0.6, reader_abstains=True),
    )
    assert (tuned.abstention, tuned.reader_abstains) == (Abstention(min_relevance=0.6, min_score=7.5), True)
    for name in ("ircot", "decompose", "self_route"):
        built = build_strategy(name, retriever, llm, settings, Abstention(min_relevance=0.7))
        inner = getattr(built, "single", built)
        assert inner.abstention == Abstention(min_relevance=0.7), name


def test_the_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_ABSTAIN_MIN_SCORE", "3.25")
    monkeypatch.setenv("ARAG_ABSTAIN_MIN_RELEVANCE", "0.4")
    monkeypatch.setenv("ARAG_READER_ABSTAINS", "true")
    strategy = build_strategy("single_step", FakeRetriever([]), FakeLLM([]), Settings(_env_file=None))
    assert (strategy.abstention, strategy.reader_abstains) == (Abstention(min_relevance=0.4, min_score=3.25), True)
