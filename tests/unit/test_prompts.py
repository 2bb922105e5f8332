"""Every strategy's prompt in both forms, and `ask` choosing the one the generator wants."""

from __future__ import annotations

import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.prompts import Prompt, decompose, ircot, no_retrieval, single_step
from adaptive_rag.strategies import NoRetrieval, SingleStep
from adaptive_rag.strategies.base import ask
from tests.unit.fakes import FakeLLM, FakeRetriever

FIELDS = {"question": "Q?", "passages": "[1] T: x", "reasoning": ""}
ALL = [no_retrieval.PROMPT, single_step.PROMPT, single_step.ABSTAIN, decompose.PROMPT, ircot.PROMPT]


@pytest.mark.parametrize("prompt", ALL)
def test_both_forms_render_the_question(prompt: Prompt) -> None:
    assert "Q?" in prompt.text(**FIELDS)
    messages = prompt.messages(**FIELDS)
    assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
    assert "Q?" in messages[-1]["content"]
    # worked examples alternate user / assistant between the system and the real turn
    roles = [m["role"] for m in messages[1:-1]]
    assert roles == ["user", "assistant"] * len(prompt.examples)


def test_a_chat_generator_gets_messages_and_the_chat_stops() -> None:
    llm = FakeLLM(["Paris"], prompt_style="chat")
    ask(llm, no_retrieval.PROMPT, question="Capital of France?")
    assert llm.calls[0].stop == no_retrieval.PROMPT.chat_stop
    assert "Jane Austen" in llm.prompts[0]  # the worked example travels as a turn
    assert llm.prompts[0].endswith("Capital of France?")


def test_a_completion_generator_gets_the_few_shot_text() -> None:
    llm = FakeLLM([" Paris"])
    result = NoRetrieval(llm).run("Capital of France?")
    assert result.answer == "Paris"
    assert llm.prompts == [no_retrieval.PROMPT.text(question="Capital of France?")]
    assert llm.calls[0].stop == no_retrieval.PROMPT.stop


def test_the_chat_reader_sees_the_passages_and_the_question() -> None:
    passages = [Passage(id="p1", title="Vienna", text="Vienna lies on the Danube.", score=3.0)]
    llm = FakeLLM(["the Danube"], prompt_style="chat")
    result = SingleStep(FakeRetriever(passages), llm).run("Which river?")
    assert result.answer == "the Danube"
    assert "[1] Vienna: Vienna lies on the Danube." in llm.prompts[0]
    assert llm.prompts[0].endswith("Question: Which river?")
