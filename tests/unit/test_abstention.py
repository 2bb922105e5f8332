"""Single-step abstention (support semantics): below the retrieval threshold the LLM is not called;
with the abstaining reader, its no-answer marker abstains. Both off by default: unchanged tier B."""

from __future__ import annotations

import pytest
from fakes import FakeLLM, FakeRetriever

from adaptive_rag.domain import Passage
from adaptive_rag.prompts import format_passages
from adaptive_rag.prompts import single_step as prompt
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import SingleStep, build_strategy
from adaptive_rag.strategies.single_step import BELOW_THRESHOLD, READER_FOUND_NONE, says_no_answer


def scored(*scores: float) -> list[Passage]:
    return [Passage(id=f"d{i}#0", title=f"T{i}", text=f"text {i}", score=s, doc_id=f"d{i}")
            for i, s in enumerate(scores)]


def test_defaults_keep_the_plain_reader_and_never_abstain() -> None:
    llm, passages = FakeLLM(["Answer: the Danube"]), scored(0.1, 0.05)
    result = SingleStep(FakeRetriever(passages), llm).run("which river?")
    assert (result.answer, result.answerable, result.abstain_reason) == ("the Danube", True, "")
    assert llm.prompts == [prompt.PROMPT.text(passages=format_passages(passages), question="which river?")]
    assert prompt.NO_ANSWER_MARKER not in llm.prompts[0]


def test_defaults_call_the_reader_even_with_no_passages() -> None:
    llm = FakeLLM(["Paris"])
    result = SingleStep(FakeRetriever([]), llm).run("capital of France?")
    assert result.answerable and result.answer == "Paris" and len(llm.calls) == 1


@pytest.mark.parametrize("passages", [scored(3.0, 2.5), [], scored(0.0)])
def test_below_the_threshold_abstains_without_calling_the_llm(passages: list[Passage]) -> None:
    llm = FakeLLM([])  # any call fails the test
    result = SingleStep(FakeRetriever(passages), llm, min_score=4.0).run("who won in 1972?")
    assert not result.answerable
    assert result.abstain_reason == BELOW_THRESHOLD == "no passage above the retrieval threshold"
    assert result.answer == "" and result.steps == 1 and llm.calls == []
    assert result.passages == passages  # kept for the record and the sources
    assert "retrieve" in result.timings and "generate" not in result.timings


@pytest.mark.parametrize("scores", [(4.0,), (1.0, 9.5), (4.0001, 0.0)])
def test_one_passage_at_or_above_the_threshold_is_enough(scores: tuple[float, ...]) -> None:
    llm = FakeLLM(["42"])
    result = SingleStep(FakeRetriever(scored(*scores)), llm, min_score=4.0).run("q?")
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
    result = SingleStep(FakeRetriever(scored(1.0)), llm, min_score=2.0, reader_abstains=True).run("q?")
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


def test_build_strategy_wires_the_settings(settings: Settings) -> None:
    retriever, llm = FakeRetriever([]), FakeLLM([])
    plain = build_strategy("single_step", retriever, llm, settings)
    assert (plain.min_score, plain.reader_abstains) == (0.0, False)
    tuned = build_strategy(
        "single_step", retriever, llm,
        Settings(_env_file=None, abstain_min_score=7.5, reader_abstains=True),
    )
    assert (tuned.min_score, tuned.reader_abstains) == (7.5, True)


def test_the_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_ABSTAIN_MIN_SCORE", "3.25")
    monkeypatch.setenv("ARAG_READER_ABSTAINS", "true")
    strategy = build_strategy("single_step", FakeRetriever([]), FakeLLM([]), Settings(_env_file=None))
    assert (strategy.min_score, strategy.reader_abstains) == (3.25, True)
