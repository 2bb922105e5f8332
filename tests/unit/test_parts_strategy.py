"""Tier C's two-part answers (`strategies.parts`): each part read on its own over its own passages,
at once on a server, the replies joined with their citations renumbered; one-part questions go to
the wrapped strategy."""

from __future__ import annotations

import threading
import time

from fakes import FakeLLM, FakeRetriever

from adaptive_rag.contracts import AnswerStyle
from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import PartsInParallel, build_strategy
from adaptive_rag.strategies.abstention import Abstention
from adaptive_rag.strategies.base import metered, run_metered
from adaptive_rag.strategies.parts import UNANSWERED_PART

TWO_PARTS = "Which plan is required for the Lumora Developer API, and what is its rate limit?"
PLAN = [Passage(id="kb-034", title="Developer API access", text="The API needs Lumora Pro.", score=9.0),
        Passage(id="kb-013", title="Plans", text="Plus and Pro.", score=4.0)]
LIMIT = [Passage(id="kb-035", title="API rate limits", text="120 requests per minute.", score=8.0),
         Passage(id="kb-034", title="Developer API access", text="The API needs Lumora Pro.", score=3.0)]


def by_part(query: str, k: int) -> list[Passage]:
    return list(LIMIT if "rate limit" in query else PLAN)


class Whole:
    """The wrapped multi-step strategy: records what it was asked."""

    name = "decompose"

    def __init__(self) -> None:
        self.asked: list[str] = []

    def run(self, question: str) -> StrategyResult:
        self.asked.append(question)
        return StrategyResult(strategy=self.name, answer="whole", steps=2)


def support_reply(prompt: str) -> str:
    question = prompt.rsplit("Question:", 1)[-1]
    if "rate limit" in question:
        return "The Developer API allows 120 requests per minute [1]."
    return "The Developer API requires a Lumora Pro subscription [1]."


def parts(llm: FakeLLM, style: AnswerStyle = AnswerStyle.SUPPORT, **kw) -> tuple[PartsInParallel, Whole]:
    whole = Whole()
    return PartsInParallel(FakeRetriever(by_part), llm, whole, style=style, **kw), whole


def test_each_part_is_read_on_its_own_passages_and_the_replies_joined_with_citations_renumbered():
    llm = FakeLLM(support_reply, prompt_style="chat")
    strategy, whole = parts(llm)
    with metered() as usage:
        result = strategy.run(TWO_PARTS)
    assert whole.asked == [] and result.steps == 2 and result.answerable
    assert [p.id for p in result.passages] == ["kb-034", "kb-013", "kb-035"]
    assert result.answer == ("The Developer API requires a Lumora Pro subscription [1].\n\n"
                             "The Developer API allows 120 requests per minute [3].")
    assert len(llm.calls) == 2 and usage.llm_calls == 2  # each part's tokens reach the run's meter
    assert usage.prompt_tokens == sum(len(c.prompt.split()) for c in llm.calls)
    first, second = sorted(llm.prompts, key=lambda p: "rate limit" in p.rsplit("Question:", 1)[-1])
    assert "Lumora Pro" in first and "120 requests" not in first  # a part sees its own passages only
    assert "120 requests" in second and result.strategy == "decompose"


def test_the_short_style_joins_the_spans():
    llm = FakeLLM(lambda p: "120 requests per minute" if "rate limit" in p.rsplit("Question:", 1)[-1]
                  else "Lumora Pro", prompt_style="chat")
    result = parts(llm, AnswerStyle.SHORT)[0].run(TWO_PARTS)
    assert result.answer == "Lumora Pro; 120 requests per minute"


def test_a_question_of_one_part_goes_to_the_wrapped_strategy():
    llm = FakeLLM(prompt_style="chat")
    strategy, whole = parts(llm)
    result = strategy.run("What is the rate limit of the Lumora Developer API?")
    assert whole.asked == ["What is the rate limit of the Lumora Developer API?"] and result.answer == "whole"
    assert llm.calls == []


def test_on_a_server_the_parts_are_read_at_once_and_in_a_model_in_turn():
    active, peak, lock = [0], [0], threading.Lock()

    def slow(prompt: str) -> str:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        return support_reply(prompt)

    parts(FakeLLM(slow, prompt_style="chat"), parallel=2)[0].run(TWO_PARTS)
    assert peak[0] == 2
    peak[0] = 0
    parts(FakeLLM(slow, prompt_style="chat"), parallel=1)[0].run(TWO_PARTS)
    assert peak[0] == 1


def test_a_part_the_knowledge_base_does_not_answer_says_so_and_every_part_unanswered_abstains():
    def reply(prompt: str) -> str:
        question = prompt.rsplit("Question:", 1)[-1]
        return "not in the passages" if "rate limit" in question else support_reply(prompt)

    strategy = parts(FakeLLM(reply, prompt_style="chat"), reader_abstains=True)[0]
    result = strategy.run(TWO_PARTS)
    assert result.answerable and result.answer.startswith("The Developer API requires a Lumora Pro")
    assert result.answer.endswith(UNANSWERED_PART.format(part="what is its rate limit"))
    gate = Abstention(min_score=100.0)  # nothing retrieved scores that high: both parts abstain
    llm = FakeLLM(prompt_style="chat")
    abstained = parts(llm, abstention=gate)[0].run(TWO_PARTS)
    assert not abstained.answerable and abstained.answer == "" and abstained.abstain_reason
    assert llm.calls == [] and abstained.passages


def test_build_strategy_wraps_the_multi_step_strategies_unless_switched_off_and_reads_at_once_on_a_server():
    settings = Settings(_env_file=None)
    llm, retriever = FakeLLM(prompt_style="chat"), FakeRetriever(by_part)
    for name in ("ircot", "decompose", "evidence"):
        built = build_strategy(name, retriever, llm, settings)
        assert isinstance(built, PartsInParallel) and built.name == name and built.parallel == 1
    served = build_strategy("decompose", retriever, llm, Settings(_env_file=None, llm_base_url="http://127.0.0.1:1"))
    assert served.parallel == 2
    plain = build_strategy("decompose", retriever, llm, Settings(_env_file=None, answer_parts=False))
    assert not isinstance(plain, PartsInParallel)
    assert not isinstance(build_strategy("single_step", retriever, llm, settings), PartsInParallel)
    result = run_metered(build_strategy("decompose", retriever, FakeLLM(support_reply, prompt_style="chat"),
                                        settings, style=AnswerStyle.SUPPORT), TWO_PARTS)
    assert result.usage.llm_calls == 2 and "[3]" in result.answer
