"""Answer styles: `short` reads a span as before; `support` reads a full answer that cites the
passages it used, and a support answer citing none gets the top source appended. The style is
stored with the tenant's knowledge base, shown by `describe`, set by the operator, and the
worker's strategies read it."""

from __future__ import annotations

import pytest
from fakes import FakeLLM, FakeRetriever
from frontdoor_fakes import FakeKnowledgeIndex
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from adaptive_rag.contracts import AnswerStyle, StrategyName
from adaptive_rag.domain import Passage
from adaptive_rag.errors import InvalidRequestError, KnowledgeBaseMissingError
from adaptive_rag.knowledge.documents import Document, Section
from adaptive_rag.knowledge.service import STYLE_FROM_DEPLOYMENT, STYLE_FROM_TENANT, KnowledgeBaseService
from adaptive_rag.prompts import single_step as prompts
from adaptive_rag.settings import Settings
from adaptive_rag.storage import Base, KnowledgeRecords
from adaptive_rag.strategies import build_strategy
from adaptive_rag.strategies.single_step import (
    SingleStep, cited, clean_support_answer, ensure_citation, reader_prompt,
)

PASSAGES = [
    Passage("returns#0", "Returns", "Items can be returned within 30 days at any post office.", 9.0),
    Passage("refunds#0", "Refunds", "Refunds arrive within 5 business days.", 7.0),
]


def test_both_styles_sit_side_by_side_and_the_reader_picks_by_style_and_abstention() -> None:
    assert reader_prompt(AnswerStyle.SHORT, False) is prompts.PROMPT
    assert reader_prompt(AnswerStyle.SHORT, True) is prompts.ABSTAIN
    assert reader_prompt(AnswerStyle.SUPPORT, False) is prompts.SUPPORT
    assert reader_prompt(AnswerStyle.SUPPORT, True) is prompts.SUPPORT_ABSTAIN
    assert prompts.SUPPORT.max_tokens > prompts.PROMPT.max_tokens  # a full answer, not a span
    assert prompts.NO_ANSWER_MARKER in prompts.SUPPORT_ABSTAIN.system
    assert prompts.NO_ANSWER_MARKER not in prompts.SUPPORT.system


@pytest.mark.parametrize(("answer", "numbers"), [
    ("Return it within 30 days [1]. Refunds take 5 days [2].", [1, 2]),
    ("Within 30 days [2][1] [2].", [2, 1]),
    ("Within 30 days [3].", []),  # no third passage: not a citation
    ("Within 30 days [0].", []),
    ("Within 30 days.", []),
])
def test_citations_are_the_passage_numbers_the_answer_names(answer: str, numbers: list[int]) -> None:
    assert cited(answer, PASSAGES) == numbers


def test_an_answer_citing_no_passage_gets_the_top_source_appended() -> None:
    assert ensure_citation("Within 30 days.", PASSAGES) == "Within 30 days. [1]"
    assert ensure_citation("Within 30 days [7].", PASSAGES) == "Within 30 days [7]. [1]"
    assert ensure_citation("Within 30 days [2].", PASSAGES) == "Within 30 days [2]."
    assert ensure_citation("Within 30 days.", []) == "Within 30 days."  # nothing to cite


def test_a_support_answer_keeps_its_steps_and_loses_its_prefix() -> None:
    text = "Answer: To return it:\n1. Open Orders [1].\n2. Print the label [1].\n\n"
    assert clean_support_answer(text) == "To return it:\n1. Open Orders [1].\n2. Print the label [1]."


def test_single_step_in_support_style_answers_in_full_and_always_cites() -> None:
    llm = FakeLLM(["You can return an item within 30 days at any post office.\nRefunds take 5 days."])
    result = SingleStep(FakeRetriever(PASSAGES), llm, style=AnswerStyle.SUPPORT).run("how do I return?")
    assert result.answerable
    assert result.answer == ("You can return an item within 30 days at any post office.\n"
                             "Refunds take 5 days. [1]")
    assert "cite the passage" in llm.prompts[0] or "citing the passage" in llm.prompts[0]
    assert llm.calls[0].max_tokens == prompts.SUPPORT.max_tokens


def test_single_step_in_short_style_is_the_span_reader_as_before() -> None:
    llm = FakeLLM(["30 days.\nmore text"])
    result = SingleStep(FakeRetriever(PASSAGES), llm).run("how long to return?")
    assert result.answer == "30 days"
    assert llm.calls[0].max_tokens == prompts.PROMPT.max_tokens


def test_a_support_reader_that_opens_with_the_marker_abstains_one_that_mentions_it_does_not() -> None:
    abstaining = SingleStep(FakeRetriever(PASSAGES), FakeLLM(["Not in the passages."]),
                            reader_abstains=True, style=AnswerStyle.SUPPORT).run("gift cards?")
    assert not abstaining.answerable and abstaining.answer == ""
    mentioning = SingleStep(
        FakeRetriever(PASSAGES),
        FakeLLM(["Returns within 30 days [1]; anything not in the passages needs an agent."]),
        reader_abstains=True, style=AnswerStyle.SUPPORT).run("returns?")
    assert mentioning.answerable and mentioning.answer.startswith("Returns within 30 days [1]")


@pytest.mark.parametrize("name", [StrategyName.SINGLE_STEP, StrategyName.IRCOT, StrategyName.DECOMPOSE,
                                  StrategyName.SELF_ROUTE])
def test_every_retrieving_strategy_answers_support_style_with_a_citation(name: str) -> None:
    def reply(prompt: str) -> str:
        if "Question:" in prompt and "customer" in prompt.lower():
            return "Return it at any post office within 30 days."  # the support reader: no citation
        return "So the answer is: 30 days."  # IRCoT reasoning, decompose's split
    strategy = build_strategy(name, FakeRetriever(PASSAGES), FakeLLM(reply), Settings(_env_file=None),
                              style=AnswerStyle.SUPPORT)
    result = strategy.run("how do I return an item?")
    assert result.answerable, result.abstain_reason
    assert result.answer.endswith("[1]") and "post office" in result.answer


@pytest.fixture
def service() -> KnowledgeBaseService:
    engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    Base.metadata.create_all(engine)
    return KnowledgeBaseService(FakeKnowledgeIndex(), KnowledgeRecords(engine), chunk_words=20,
                                overlap_words=5, backend="fake", default_style=AnswerStyle.SUPPORT)


def test_the_style_is_stored_with_the_knowledge_base_shown_and_set_by_the_operator(service) -> None:
    service.upsert("acme", [Document("a", "Returns", (Section("", "Within 30 days."),))])
    info = service.describe("acme")
    assert (info.answer_style, info.answer_style_source) == (AnswerStyle.SUPPORT, STYLE_FROM_DEPLOYMENT)
    info = service.set_answer_style("acme", AnswerStyle.SHORT)
    assert (info.answer_style, info.answer_style_source) == (AnswerStyle.SHORT, STYLE_FROM_TENANT)
    assert service.records.state("acme").answer_style is AnswerStyle.SHORT
    service.upsert("acme", [Document("b", "Refunds", (Section("", "Five days."),))])
    assert service.describe("acme").answer_style is AnswerStyle.SHORT  # a write keeps the choice
    info = service.set_answer_style("acme", None)
    assert (info.answer_style, info.answer_style_source) == (AnswerStyle.SUPPORT, STYLE_FROM_DEPLOYMENT)


def test_a_style_for_a_tenant_without_knowledge_base_or_an_unknown_style_is_refused(service) -> None:
    with pytest.raises(KnowledgeBaseMissingError):
        service.set_answer_style("nobody", AnswerStyle.SHORT)
    service.upsert("acme", [Document("a", "Returns", (Section("", "Within 30 days."),))])
    with pytest.raises(InvalidRequestError, match="short, support"):
        service.set_answer_style("acme", "verbose")  # type: ignore[arg-type]


def test_tenants_default_to_support_and_the_deployment_may_choose_short(monkeypatch) -> None:
    assert Settings(_env_file=None).answer_style is AnswerStyle.SUPPORT
    monkeypatch.setenv("ARAG_ANSWER_STYLE", "short")
    assert Settings(_env_file=None).answer_style is AnswerStyle.SHORT


def test_a_style_given_as_its_plain_name_reads_the_same() -> None:
    llm = FakeLLM(["Within 30 days at any post office."])
    result = SingleStep(FakeRetriever(PASSAGES), llm, style="support").run("how do I return?")  # type: ignore[arg-type]
    assert result.answer == "Within 30 days at any post office. [1]"
