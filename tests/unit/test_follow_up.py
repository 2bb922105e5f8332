"""Follow-up turns rewritten into standalone questions: the rules for the easy cases (one
pronoun, an elliptical "and X?"), the reader behind the LLM port otherwise, and nothing touched
when a turn shows no sign of depending on the conversation."""

from __future__ import annotations

import pytest
from fakes import FakeLLM

from adaptive_rag.errors import LLMUnavailableError
from adaptive_rag.strategies.follow_up import (
    RewriteMethod, Turn, depends_on_conversation, names_no_subject, standalone_question, topic,
)


@pytest.mark.parametrize(("question", "first", "last"), [
    ("What is a novel coronavirus?", "a novel coronavirus", "a novel coronavirus"),
    ("How does COVID-19 spread?", "COVID-19", "COVID-19"),
    ("What is the warranty on the frame?", "the warranty on the frame", "the frame"),
    ("How long does the battery last?", "the battery", "the battery"),
    ("How do I return my order?", "my order", "my order"),
    ("Who can get the vaccine?", "the vaccine", "the vaccine"),
    ("Can I pay with PayPal?", "PayPal", "PayPal"),
])
def test_the_topic_is_the_previous_questions_noun_phrase(question: str, first: str, last: str) -> None:
    assert topic(question) == first
    assert topic(question, last=True) == last


@pytest.mark.parametrize(("previous", "follow_up", "standalone"), [
    ("What is a novel coronavirus?", "how does it spread?", "How does a novel coronavirus spread?"),
    ("Who can get the vaccine?", "is it safe for children?", "Is the vaccine safe for children?"),
    ("What is the warranty on the frame?", "and the battery?", "What is the warranty on the battery?"),
    ("How long does the battery last?", "and the motor?", "How long does the motor last?"),
    ("How do I return my order?", "and a gift?", "How do I return a gift?"),
    ("How long does shipping take?", "and to Canada?", "How long does shipping take to Canada?"),
    ("Can I pay with PayPal?", "what about Apple Pay?", "Can I pay with Apple Pay?"),
    ("How does COVID-19 spread?", "and the flu?", "How does the flu spread?"),
])
def test_the_easy_cases_are_rewritten_by_rules_without_the_reader(previous, follow_up, standalone) -> None:
    llm = FakeLLM([])  # any reader call fails the test
    rewrite = standalone_question(follow_up, [Turn(previous, "some answer")], llm)
    assert (rewrite.question, rewrite.method) == (standalone, RewriteMethod.RULES)
    assert llm.calls == []


@pytest.mark.parametrize("question", ["What are the symptoms of the flu?", "thanks!", "how do I reset my hub?"])
def test_a_turn_that_stands_alone_is_used_as_sent(question: str) -> None:
    assert not depends_on_conversation(question)
    rewrite = standalone_question(question, [Turn("What is a novel coronavirus?")], FakeLLM([]))
    assert (rewrite.question, rewrite.method, rewrite.changed) == (question, RewriteMethod.NONE, False)


def test_without_history_nothing_is_rewritten() -> None:
    assert standalone_question("how does it spread?", []).method is RewriteMethod.NONE


def test_what_no_rule_fits_goes_to_the_reader_with_the_earlier_questions() -> None:
    llm = FakeLLM(["Rewritten: Does the vaccine eligibility apply to kids as well?\nextra"])
    history = [Turn("Is the vaccine free?"), Turn("Who can get the vaccine?")]
    rewrite = standalone_question("does the same apply to kids?", history, llm)
    assert (rewrite.question, rewrite.method) == ("Does the vaccine eligibility apply to kids as well?",
                                                  RewriteMethod.READER)
    assert "Is the vaccine free?" in llm.prompts[0] and "Who can get the vaccine?" in llm.prompts[0]
    assert "does the same apply to kids?" in llm.prompts[0]


@pytest.mark.parametrize("reply", ["", "x" * 500])
def test_an_unusable_reader_reply_falls_back_to_the_previous_topic(reply: str) -> None:
    rewrite = standalone_question("does the same apply to kids?", [Turn("Who can get the vaccine?")],
                                  FakeLLM([reply]))
    assert (rewrite.question, rewrite.method) == ("does the same apply to kids? (the vaccine)",
                                                  RewriteMethod.CONTEXT)


def test_the_earlier_question_written_back_by_the_reader_is_dropped() -> None:
    history = [Turn("How long is the incubation period for COVID-19?")]
    both = standalone_question("and when is someone infectious then?", history,
                               FakeLLM(["How long is the incubation period for COVID-19? When is someone infectious?"]))
    assert (both.question, both.method) == ("When is someone infectious?", RewriteMethod.READER)
    only = standalone_question("and when is someone infectious then?", history,
                               FakeLLM(["How long is the incubation period for COVID-19?"]))
    assert only.method is RewriteMethod.CONTEXT


def test_a_reader_that_is_away_costs_the_rewrite_not_the_turn() -> None:
    def away(prompt: str) -> str:
        raise LLMUnavailableError("connection refused")
    rewrite = standalone_question("does the same apply to kids?", [Turn("Who can get the vaccine?")],
                                  FakeLLM(away))
    assert rewrite.method is RewriteMethod.CONTEXT and "the vaccine" in rewrite.question


def test_without_a_reader_the_previous_topic_keeps_retrieval_on_the_subject() -> None:
    rewrite = standalone_question("is the same true for them?", [Turn("Should I wear a mask?")])
    assert (rewrite.question, rewrite.method) == ("is the same true for them? (a mask)", RewriteMethod.CONTEXT)


def test_a_do_question_keeps_its_subject_and_drops_its_verb() -> None:
    rewrite = standalone_question("how do I cancel it?", [Turn("What does the Lumora Plus plan include?")])
    assert rewrite.question == "How do I cancel the Lumora Plus plan?"


@pytest.mark.parametrize("question", ["how many can I have?", "how many at once?", "why not?", "how much?",
                                      "and how long?", "can I do that more than once?"])
def test_a_turn_that_names_no_subject_of_its_own_depends_on_the_conversation(question: str) -> None:
    assert depends_on_conversation(question)


@pytest.mark.parametrize("question", ["How many API keys can I have?", "Why is my hub offline?",
                                      "how much is express shipping?", "Should I still go to work?",
                                      "Who wrote Hamlet?", "How long is the warranty?"])
def test_a_question_with_a_word_of_its_own_names_its_subject(question: str) -> None:
    assert not names_no_subject(question)


def test_a_turn_without_a_subject_is_searched_with_the_previous_topic() -> None:
    rewrite = standalone_question("how many can I have?", [Turn("How do I create an API key?")])
    assert (rewrite.question, rewrite.method) == ("how many can I have? (an API key)", RewriteMethod.CONTEXT)


@pytest.mark.parametrize("turn", ["no", "not now", "later", "ok then"])
def test_a_reply_that_asks_nothing_is_not_taken_for_a_subjectless_question(turn: str) -> None:
    assert not names_no_subject(turn)


@pytest.mark.parametrize("turn", ["how are you?", "what's up?", "what do you mean?"])
def test_small_talk_to_the_assistant_is_not_taken_for_a_subjectless_question(turn: str) -> None:
    assert not names_no_subject(turn)
