"""Comparison questions read per side: which questions the rules take as comparisons, what each
side's fact decides by rule, and the evidence strategy's per-side reads over a fake reader."""

from __future__ import annotations

import pytest
from fakes import FakeLLM

from adaptive_rag.domain import Passage
from adaptive_rag.evidence.comparison import Comparison, as_date, as_lifespan, as_number, decide, split_comparison
from adaptive_rag.evidence.graphs import EntityGraphs
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from adaptive_rag.strategies import EvidenceRead


@pytest.mark.parametrize("question, sides, kind, direction, measure", [
    ("Was Jamie Curry or Alyaksey Vasilewski born first?", ("Jamie Curry", "Alyaksey Vasilewski"), "which", "earlier", "date"),
    ("Which film has the director who died earlier, The Hitler Gang or Flannelfoot?",
     ("The Hitler Gang", "Flannelfoot"), "which", "earlier", "date"),
    ("Which film whose director is younger, The Pulse Of Life or The Hungover Games?",
     ("The Pulse Of Life", "The Hungover Games"), "which", "later", "date"),
    ("Who lived longer, Bernhard Afinger or Melvin Kranzberg?", ("Bernhard Afinger", "Melvin Kranzberg"), "which", "more", "lifespan"),
    ("Which magazine has more issues per month, Club or Pro Football Weekly", ("Club", "Pro Football Weekly"), "which", "more", "amount"),
    ("Which movie was released first, 'Mean Girls' or 'Heathers'?", ("Mean Girls", "Heathers"), "which", "earlier", "date"),
    ("Are Victoria Winter and Jon Sullivan of the same nationality?", ("Victoria Winter", "Jon Sullivan"), "same", None, "attribute"),
    ("Are both Cunaú River and Rio Verde located in the same country?", ("Cunaú River", "Rio Verde"), "same", None, "attribute"),
])
def test_the_common_forms_are_comparisons_with_their_sides(question, sides, kind, direction, measure) -> None:
    found = split_comparison(question)
    assert found is not None
    assert (found.sides, found.kind, found.direction, found.measure) == (sides, kind, direction, measure)


@pytest.mark.parametrize("question", [
    "Where was the place of death of the director of film Emile The African?",
    "Which school is named after a person, Sir Syed University or Manhattan College?",  # no direction to compare
    "Who was born first, Ada or Ada?",  # the same side twice
    "Is tea or coffee?",
    "",
])
def test_other_questions_are_no_comparison(question: str) -> None:
    assert split_comparison(question) is None


def test_a_side_is_retrieved_without_the_other_side() -> None:
    found = split_comparison("Who was born first, Ada Lovelace or Alan Turing?")
    assert found.side_query("Ada Lovelace") == "Who was born first, Ada Lovelace or ?"
    assert "Ada" not in found.side_query("Alan Turing")


def test_dates_numbers_and_lifespans_are_read_from_the_reader_s_words() -> None:
    assert as_date("born 5 March 1901 in Paris") == (1901, 3, 5)
    assert as_date("June 12, 1934") == (1934, 6, 12)
    assert as_date("in 1901") == (1901, 0, 0)
    assert as_date("unknown") is None
    assert as_number("about 1,200 issues") == 1200.0 and as_number("none") is None
    assert as_lifespan("1 May 1820 – 3 June 1899") == 79 and as_lifespan("1820") is None


@pytest.mark.parametrize("direction, facts, answer", [
    ("earlier", ("12 March 1901", "1899"), "B"),
    ("earlier", ("12 March 1901", "3 April 1901"), "A"),
    ("later", ("12 March 1901", "3 April 1901"), "B"),
    ("earlier", ("1901", "March 1901"), None),  # as precise as both say: the same year, a tie
    ("earlier", ("1901", "not found"), None),  # one side has no date: read the facts instead
])
def test_two_dates_decide_in_the_question_s_direction(direction, facts, answer) -> None:
    assert decide(Comparison("q", ("A", "B"), "which", direction, "date"), facts) == answer


def test_amounts_lifespans_and_same_questions() -> None:
    assert decide(Comparison("q", ("A", "B"), "which", "more", "amount"), ("12", "7")) == "A"
    assert decide(Comparison("q", ("A", "B"), "which", "less", "amount"), ("12", "7")) == "B"
    assert decide(Comparison("q", ("A", "B"), "which", "more", "lifespan"), ("1900 - 1950", "1910 - 1990")) == "B"
    assert decide(Comparison("q", ("A", "B"), "same"), ("French", "France")) is None  # read, never by rule


# --- the evidence strategy, per side --------------------------------------------------------------

KB = [
    Passage("heat", "Heat (1995 film)", "Heat is a 1995 American crime film directed by Michael Mann."),
    Passage("mann", "Michael Mann", "Michael Mann (born February 5, 1943) is an American film director."),
    Passage("thief", "Thief (1981 film)", "Thief is a 1981 neo-noir film directed by Walter Hill."),
    Passage("hill", "Walter Hill", "Walter Hill (born January 10, 1942) is an American film director."),
    Passage("other", "Chicago", "Chicago is a city in Illinois."),
]
QUESTION = "Which film has the director born first, Heat or Thief?"


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> TantivyRetriever:
    return TantivyRetriever.build(tmp_path_factory.mktemp("kb") / "index", KB)


def per_side(retriever, llm: FakeLLM) -> EvidenceRead:
    return EvidenceRead(retriever, llm, gatherer="chain", graphs=EntityGraphs(background=False), compare_sides=True)


def test_each_side_is_read_on_its_own_passages_and_the_dates_decide(retriever) -> None:
    llm = FakeLLM(["February 5, 1943", "January 10, 1942"])
    result = per_side(retriever, llm).run(QUESTION)
    assert result.answer == "Thief" and result.answerable
    assert len(llm.calls) == 2  # one read per side, no third: the rule decided
    assert "About Heat only" in llm.prompts[0] and "About Thief only" in llm.prompts[1]
    assert "Heat is a 1995" in llm.prompts[0]
    assert "decided by rule: 'Thief'" in result.trace
    assert {"heat", "thief"} <= {p.id for p in result.passages}


def test_facts_no_rule_decides_are_read_together(retriever) -> None:
    llm = FakeLLM(["a long time ago", "1942", "Thief"])
    result = per_side(retriever, llm).run(QUESTION)
    assert result.answer == "Thief" and len(llm.calls) == 3
    assert "[1] Heat: a long time ago" in llm.prompts[2] and "[2] Thief: 1942" in llm.prompts[2]
    assert "the two facts read together" in result.trace


def test_off_or_not_a_comparison_reads_at_once(retriever) -> None:
    llm = FakeLLM(["Thief"])
    EvidenceRead(retriever, llm, gatherer="chain", graphs=EntityGraphs(background=False)).run(QUESTION)
    assert len(llm.calls) == 1 and "About" not in llm.prompts[0]
    llm = FakeLLM(["Michael Mann"])
    per_side(retriever, llm).run("Who directed Heat?")
    assert len(llm.calls) == 1
