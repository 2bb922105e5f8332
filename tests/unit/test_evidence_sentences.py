"""Evidence that fits (`evidence.sentences`): the passages' best sentences up to a token budget,
under their passage numbers, and tier B / per-part reads with and without it."""

from __future__ import annotations

from fakes import FakeLLM, FakeRetriever

from adaptive_rag.contracts import AnswerStyle
from adaptive_rag.domain import Passage
from adaptive_rag.evidence.sentences import (
    estimate_tokens,
    format_evidence,
    kept_passages,
    select_units,
    split_units,
)
from adaptive_rag.prompts import format_passages
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import PartsInParallel, SingleStep, build_strategy

HUB = Passage("kb-001", "Lumora Hub H2 overview",
              "The Lumora Hub H2 is the central controller of every Lumora home. It was released in March "
              "2022. A single Hub H2 can control up to 64 devices, including bulbs and sensors. It draws "
              "about 1.8 W at idle. The hub retails for $59.99 on its own.")
BULB = Passage("kb-003", "Lumora A19 Color bulb specifications",
               "The A19 Color bulb fits E26 sockets and delivers 1100 lumens. Its rated lifetime is 25,000 "
               "hours. It reproduces 16 million colors.")
RESET = Passage("kb-020", "Resetting a bulb",
                "To reset a bulb:\n1. Switch it off and on five times.\n2. Wait for it to blink. It blinks "
                "twice.\n3. Pair it again in the app.\nThe reset keeps no schedules.")
PASSAGES = [BULB, HUB, RESET]


def test_units_are_sentences_of_prose_and_a_list_stays_one_unit():
    assert split_units("One here. Two there! Three?") == ["One here.", "Two there!", "Three?"]
    units = split_units(RESET.text)
    assert units == ["To reset a bulb:\n1. Switch it off and on five times.\n2. Wait for it to blink. It "
                     "blinks twice.\n3. Pair it again in the app.",
                     "The reset keeps no schedules."]
    assert split_units("") == []
    assert split_units("Version 2.4 is out, e.g. for Linux. It works.") == [
        "Version 2.4 is out, e.g. for Linux.", "It works."]
    assert split_units("Steps:\n- one\n- two\nDone. Really.") == ["Steps:\n- one\n- two", "Done.", "Really."]


def test_the_answering_sentence_is_kept_under_its_own_passage_number_and_title():
    text = format_evidence("How many devices can one Hub H2 control?", PASSAGES, 30)
    assert text.startswith("[2] Lumora Hub H2 overview: ")
    assert "64 devices" in text
    assert "[1]" not in text and "[3]" not in text  # nothing of the other passages fits
    assert "1100 lumens" not in text


def test_kept_units_keep_passage_and_text_order_and_mark_gaps():
    kept = select_units("How many devices can the Hub H2 control and what does it cost?", PASSAGES, 60)
    assert [(u.passage, u.position) for u in kept] == sorted((u.passage, u.position) for u in kept)
    text = format_evidence("How many devices can the Hub H2 control and what does it cost?", PASSAGES, 60)
    assert "64 devices" in text and "$59.99" in text
    assert " ... " in text  # the sentences between them were left out


def test_the_budget_bounds_the_evidence_and_a_large_one_keeps_everything():
    question = "How do I reset a bulb?"
    for budget in (10, 25, 50, 80):
        text = format_evidence(question, PASSAGES, budget)
        assert sum(estimate_tokens(line) for line in text.split("\n[")) <= budget + 2
    whole = format_evidence(question, PASSAGES, 10_000)
    for passage in PASSAGES:
        for unit in split_units(passage.text):
            assert unit in whole
    assert kept_passages(question, PASSAGES, 10_000) == [0, 1, 2]


def test_a_procedure_is_kept_whole_with_all_its_steps():
    text = format_evidence("How do I reset a bulb?", PASSAGES, 45)
    assert "[3] Resetting a bulb: " in text
    assert "1. Switch it off" in text and "3. Pair it again in the app." in text


def test_a_budget_below_the_best_unit_keeps_its_first_words_and_no_passages_give_nothing():
    text = format_evidence("How many devices can one Hub H2 control?", [HUB], 14)
    assert text.startswith("[1] Lumora Hub H2 overview: ")
    assert estimate_tokens(text) <= 14 + 1
    assert format_evidence("anything", [], 50) == ""
    assert format_evidence("the of and", PASSAGES, 20)  # stop words only: still some evidence


def test_single_step_reads_the_fitted_evidence_and_cites_against_the_retrieved_passages():
    llm = FakeLLM(["The Hub H2 controls up to 64 devices [2]."], prompt_style="chat")
    strategy = SingleStep(FakeRetriever(PASSAGES), llm, style=AnswerStyle.SUPPORT, evidence_tokens=30)
    result = strategy.run("How many devices can one Hub H2 control?")
    assert "[2] Lumora Hub H2 overview:" in llm.prompts[0]
    assert "1100 lumens" not in llm.prompts[0]
    assert result.passages == PASSAGES  # the sources are the retrieved passages, numbered as read
    assert result.answer.endswith("[2].")


def test_without_a_budget_the_reader_gets_the_passages_whole():
    llm = FakeLLM(["64"])
    SingleStep(FakeRetriever(PASSAGES), llm).run("How many devices can one Hub H2 control?")
    assert format_passages(PASSAGES) in llm.prompts[0]


def test_the_setting_reaches_tier_b_and_the_parts_reader():
    on = Settings(_env_file=None, evidence_tokens=120)
    off = Settings(_env_file=None, evidence_tokens=0)
    retriever, llm = FakeRetriever(PASSAGES), FakeLLM(["x"])
    assert build_strategy("single_step", retriever, llm, on).evidence_tokens == 120
    assert build_strategy("single_step", retriever, llm, off).evidence_tokens is None
    assert build_strategy("single_step", retriever, llm, Settings(_env_file=None)).evidence_tokens == 120
    parts = build_strategy("decompose", retriever, llm, on)
    assert isinstance(parts, PartsInParallel) and parts.evidence_tokens == 120


def test_each_part_reads_its_own_fitted_evidence():
    llm = FakeLLM(lambda prompt: "an answer [1]", prompt_style="chat")
    whole = build_strategy("decompose", FakeRetriever(PASSAGES), llm, Settings(_env_file=None, evidence_tokens=30))
    whole.run("How many devices can one Hub H2 control, and how do I reset a bulb?")
    assert len(llm.prompts) == 2
    assert all("1100 lumens" not in prompt for prompt in llm.prompts)


def test_warming_imports_the_scorer_before_any_answer() -> None:
    import sys

    from adaptive_rag.evidence.sentences import warm

    warm()
    assert "sklearn.feature_extraction.text" in sys.modules
