"""Self-Route: single step with the abstaining reader; the multi-step strategy runs exactly when the
reader abstains, and the result pays for both runs."""

from __future__ import annotations

import pytest
from fakes import FakeLLM, FakeRetriever, make_passages

from adaptive_rag.domain import StrategyResult
from adaptive_rag.prompts import single_step as reader_prompt
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import (
    ALL_STRATEGY_NAMES,
    STRATEGY_NAMES,
    Abstention,
    SelfRoute,
    SingleStep,
    build_strategy,
)
from adaptive_rag.strategies.decompose import Decompose
from adaptive_rag.strategies.self_route import ESCALATED, NOT_ESCALATED, sum_timings


class FixedMulti:
    """A multi-step stand-in with known cost: 2 steps, 5 s retrieving, 7 s generating."""

    name = "decompose"

    def __init__(self) -> None:
        self.questions: list[str] = []

    def run(self, question: str) -> StrategyResult:
        self.questions.append(question)
        return StrategyResult(
            strategy=self.name, answer="Steven Spielberg", steps=2, passages=make_passages(2, "c"),
            timings={"retrieve": 5.0, "generate": 7.0, "total": 12.0}, trace=["sub-question 1"],
        )


def self_route(reader_reply: str) -> tuple[SelfRoute, FixedMulti, FakeLLM]:
    llm, multi = FakeLLM([reader_reply]), FixedMulti()
    single = SingleStep(FakeRetriever(make_passages(3)), llm, top_k=3, reader_abstains=True)
    return SelfRoute(single, multi), multi, llm


def test_an_answering_reader_is_not_escalated() -> None:
    strategy, multi, llm = self_route("the Danube")
    result = strategy.run("Which river?")
    assert multi.questions == []
    assert (result.strategy, result.answer, result.steps) == ("self_route", "the Danube", 1)
    assert result.trace[0] == NOT_ESCALATED and result.answerable
    assert [p.id for p in result.passages] == ["p0", "p1", "p2"]
    assert result.timings["total"] < 1.0  # B alone, no multi-step cost
    # the reader was given the abstaining prompt (its no-answer marker is in it)
    assert reader_prompt.NO_ANSWER_MARKER in llm.prompts[0]


@pytest.mark.parametrize("reply", [reader_prompt.NO_ANSWER_MARKER, "Not in the passages."])
def test_an_abstaining_reader_escalates_and_costs_are_summed(reply: str) -> None:
    strategy, multi, _ = self_route(reply)
    result = strategy.run("Who directed Jaws?")
    assert multi.questions == ["Who directed Jaws?"]
    assert result.answer == "Steven Spielberg" and result.answerable
    assert result.steps == 1 + 2  # B's step plus C's
    assert result.trace[0] == ESCALATED
    assert [p.id for p in result.passages] == ["c0", "c1"]  # the evidence of the answer given
    # C's 5 s + 7 s are added to B's (tiny, real) phases
    assert 5.0 <= result.timings["retrieve"] < 5.5
    assert 7.0 <= result.timings["generate"] < 7.5
    assert 12.0 <= result.timings["total"] < 12.5


def test_a_retrieval_threshold_abstention_escalates_too() -> None:
    llm, multi = FakeLLM([]), FixedMulti()  # the reader is never called
    single = SingleStep(FakeRetriever(make_passages(2)), llm, abstention=Abstention(min_score=5.0), reader_abstains=True)
    result = SelfRoute(single, multi).run("q?")
    assert result.trace[0] == ESCALATED and result.steps == 3 and llm.calls == []


def test_it_needs_an_abstaining_reader() -> None:
    with pytest.raises(ValueError, match="abstain"):
        SelfRoute(SingleStep(FakeRetriever(), FakeLLM()), FixedMulti())


def test_sum_timings_adds_every_phase() -> None:
    a = StrategyResult("x", "", 0, timings={"generate": 1.0, "total": 1.5})
    b = StrategyResult("y", "", 1, timings={"retrieve": 2.0, "generate": 3.0, "total": 5.0})
    assert sum_timings([a, b]) == {"generate": 4.0, "retrieve": 2.0, "total": 6.5}


def test_build_strategy_uses_the_configured_multi_step_and_keeps_the_tier_list() -> None:
    settings = Settings(multi_step="decompose", top_k=3)
    strategy = build_strategy("self_route", FakeRetriever(), FakeLLM(), settings)
    assert isinstance(strategy, SelfRoute) and isinstance(strategy.multi.whole, Decompose)
    assert strategy.single.reader_abstains and strategy.single.top_k == 3
    assert "self_route" in ALL_STRATEGY_NAMES and "self_route" not in STRATEGY_NAMES


def test_build_strategy_end_to_end_with_decompose() -> None:
    # reader abstains -> decompose: one split, then its own reader call
    llm = FakeLLM([reader_prompt.NO_ANSWER_MARKER, "Who directed Jaws?", "Steven Spielberg"])
    strategy = build_strategy("self_route", FakeRetriever(make_passages(4)), llm, Settings(multi_step="decompose"))
    result = strategy.run("When was the director of Jaws born?")
    assert result.answer == "Steven Spielberg"
    assert result.steps == 1 + 2  # B, then decompose: question + one sub-question
    assert len(llm.calls) == 3
