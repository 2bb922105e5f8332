"""The four answering strategies over fake ports, plus their shared helpers and factory."""

from __future__ import annotations

import pytest
from fakes import FakeLLM, FakeRetriever, make_passages

from adaptive_rag.domain import Passage

from adaptive_rag.contracts import Tier
from adaptive_rag.prompts import decompose as decompose_prompt
from adaptive_rag.prompts import format_passages
from adaptive_rag.prompts import ircot as ircot_prompt
from adaptive_rag.prompts import no_retrieval as no_retrieval_prompt
from adaptive_rag.prompts import single_step as single_step_prompt
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import (
    STRATEGY_NAMES,
    Decompose,
    IRCoT,
    NoRetrieval,
    SingleStep,
    build_strategy,
    strategy_for_tier,
)
from adaptive_rag.strategies.base import clean_answer, merge_passages
from adaptive_rag.strategies.decompose import parse_subquestions
from adaptive_rag.strategies.ircot import first_sentence

READER_MARK = "Answer each question with a few words taken from the passages above."
IRCOT_MARK = "Answer the question by reasoning one sentence at a time"
DECOMPOSE_MARK = "Split the question into at most 3 simple questions"


def is_reader(prompt: str) -> bool:
    return READER_MARK in prompt


def is_ircot(prompt: str) -> bool:
    return IRCOT_MARK in prompt


def per_query_passages(per_query: int = 10):
    """Retriever script: distinct passages for each distinct query text (ids carry the query)."""

    def search(query: str, k: int) -> list[Passage]:
        tag = str(abs(hash(query)) % 10_000)
        return make_passages(per_query, prefix=f"q{tag}-")

    return search


def assert_timings(result, phases: set[str]) -> None:
    assert phases | {"total"} <= set(result.timings)
    assert all(v >= 0 for v in result.timings.values())
    assert result.timings["total"] >= max(result.timings[p] for p in phases)


# --- clean_answer, first_sentence, merge_passages ------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Paris", "Paris"),
        ("Answer: Paris.", "Paris"),
        ("answer - Paris", "Paris"),
        ("A: Paris", "Paris"),
        ("So the answer is: Steven Spielberg.", "Steven Spielberg"),
        ("  \n\n  Paris\nLondon\n", "Paris"),
        ('"The Raven"', "The Raven"),
        ("'Hamlet'", "Hamlet"),
        ("Hamlet.", "Hamlet"),
        ("**Jupiter**", "Jupiter"),
        ("Apple Inc.", "Apple Inc"),
        ("Answers to questions", "Answers to questions"),
        ("", ""),
        ("\n\n", ""),
    ],
)
def test_clean_answer(raw: str, expected: str) -> None:
    assert clean_answer(raw) == expected


@pytest.mark.parametrize("answer", ["A-ha", "A-League"])
def test_clean_answer_keeps_hyphenated_names_starting_with_a(answer: str) -> None:
    assert clean_answer(answer) == answer


@pytest.mark.parametrize(("raw", "expected"), [('"the Danube".', "the Danube"), ("'Hamlet'.", "Hamlet")])
def test_clean_answer_quoted_answer_with_final_period(raw: str, expected: str) -> None:
    assert clean_answer(raw) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Jaws was directed by Spielberg. He was born in 1946.", "Jaws was directed by Spielberg."),
        ("Is it Paris? Yes.", "Is it Paris?"),
        ("Wow! Indeed.", "Wow!"),
        ("1. Heat was directed by Michael Mann.", "Heat was directed by Michael Mann."),
        ("- a dash item", "a dash item"),
        ("line one\nline two. more", "line one"),
        ("X is Y. So the answer is: Y. Extra.", "X is Y. So the answer is: Y. Extra."),
        ("", ""),
    ],
)
def test_first_sentence(text: str, expected: str) -> None:
    assert first_sentence(text) == expected


def test_merge_passages_keeps_order_dedupes_and_bounds() -> None:
    a, b, c, d, e = make_passages(5)
    assert merge_passages([a, b], [b, c, a, d], 10) == [a, b, c, d]
    assert merge_passages([a, b], [c, d, e], 3) == [a, b, c]
    assert merge_passages([], [a, a, b], 5) == [a, b]
    assert merge_passages([a, b], [c], 2) == [a, b]


def test_merge_passages_dedupes_by_id_not_by_object() -> None:
    first = Passage("same", "T", "old text", 1.0)
    again = Passage("same", "T", "other text", 9.0)
    assert merge_passages([first], [again], 5) == [first]


def test_merge_passages_does_not_mutate_inputs() -> None:
    kept, new = make_passages(2), make_passages(3, prefix="n")
    merge_passages(kept, new, 4)
    assert len(kept) == 2 and len(new) == 3


# --- NoRetrieval ----------------------------------------------------------------------------------


def test_no_retrieval(settings) -> None:
    llm = FakeLLM(["Answer: Paris.\nQuestion: something else"])
    retriever = FakeRetriever(make_passages(3))
    strategy = build_strategy("no_retrieval", retriever, llm, settings)
    assert isinstance(strategy, NoRetrieval)
    result = strategy.run("What is the capital of France?")
    assert result.strategy == "no_retrieval"
    assert result.answer == "Paris"
    assert result.steps == 0
    assert result.passages == []
    assert retriever.queries == []
    assert len(llm.calls) == 1
    call = llm.calls[0]
    assert call.prompt.endswith("Question: What is the capital of France?\nAnswer:")
    assert call.max_tokens == no_retrieval_prompt.PROMPT.max_tokens
    assert call.stop == no_retrieval_prompt.PROMPT.stop
    assert_timings(result, {"generate"})


# --- SingleStep -----------------------------------------------------------------------------------


def test_single_step() -> None:
    docs = make_passages(7)
    retriever = FakeRetriever(docs)
    llm = FakeLLM(["Answer: the Danube."])
    result = SingleStep(retriever, llm, top_k=3).run("Which river?")
    assert retriever.queries == [("Which river?", 3)]
    assert result.steps == 1
    assert result.passages == docs[:3]
    assert result.answer == "the Danube"
    assert len(llm.calls) == 1
    prompt = llm.calls[0].prompt
    assert prompt.startswith(format_passages(docs[:3]))
    for p in docs[:3]:
        assert p.title in prompt and p.text in prompt
    assert docs[3].title not in prompt
    assert prompt.endswith("Question: Which river?\nAnswer:")
    assert llm.calls[0].max_tokens == single_step_prompt.PROMPT.max_tokens
    assert llm.calls[0].stop == single_step_prompt.PROMPT.stop
    assert_timings(result, {"retrieve", "generate"})


def test_single_step_with_no_passages_abstains_without_the_reader() -> None:
    llm = FakeLLM([])
    result = SingleStep(FakeRetriever([]), llm, top_k=5).run("Who?")
    assert result.passages == [] and result.answer == "" and result.steps == 1
    assert not result.answerable and llm.calls == []


def test_passages_are_cut_in_prompts() -> None:
    long = Passage("long", "Long", "x" * 1000)
    llm = FakeLLM(["ok"])
    SingleStep(FakeRetriever([long]), llm, top_k=1).run("q?")
    assert "x" * 401 not in llm.calls[0].prompt
    assert "x" * 400 + "..." in llm.calls[0].prompt


# --- IRCoT ----------------------------------------------------------------------------------------

QUESTION = "Who was born first, the director of Jaws or the author of Carrie?"


def test_ircot_stops_at_the_answer_marker() -> None:
    llm = FakeLLM([
        "Jaws was directed by Steven Spielberg. Extra sentence.",
        "Spielberg was born in 1946. So the answer is: Steven Spielberg.",
    ])
    retriever = FakeRetriever(per_query_passages(3))
    result = IRCoT(retriever, llm, top_k=3, max_steps=5, max_passages=20).run(QUESTION)
    assert result.answer == "Steven Spielberg"
    assert result.steps == 2
    assert len(llm.calls) == 2  # no reader call: the marker gave the answer
    assert retriever.query_texts == [QUESTION, "Jaws was directed by Steven Spielberg."]
    assert [k for _, k in retriever.queries] == [3, 3]
    assert result.trace == [
        "Jaws was directed by Steven Spielberg.",
        "Spielberg was born in 1946. So the answer is: Steven Spielberg.",
    ]
    # The reasoning so far is fed back into the next prompt, with the passages gathered so far.
    assert llm.calls[1].prompt.endswith("Reasoning: Jaws was directed by Steven Spielberg.")
    assert llm.calls[1].prompt.startswith(format_passages(result.passages))
    assert all(c.max_tokens == ircot_prompt.PROMPT.max_tokens for c in llm.calls)
    assert all(c.stop == ircot_prompt.PROMPT.stop for c in llm.calls)
    assert_timings(result, {"retrieve", "generate"})


def test_ircot_marker_on_first_round_is_one_step() -> None:
    llm = FakeLLM(["So the answer is: Paris"])
    retriever = FakeRetriever(make_passages(3))
    result = IRCoT(retriever, llm, max_steps=4).run("Capital of France?")
    assert (result.steps, result.answer, len(retriever.queries), len(llm.calls)) == (
        1, "Paris", 1, 1,
    )


def test_ircot_runs_to_max_steps_then_the_reader_answers() -> None:
    counter = iter(range(100))

    def reply(prompt: str) -> str:
        if is_reader(prompt):
            return "Answer: Stephen King"
        assert is_ircot(prompt)
        return f"Fact number {next(counter)} is noted. More."

    llm = FakeLLM(reply)
    retriever = FakeRetriever(per_query_passages(2))
    result = IRCoT(retriever, llm, top_k=2, max_steps=3, max_passages=50).run(QUESTION)
    assert result.steps == 3
    assert result.answer == "Stephen King"
    assert len(retriever.queries) == 3
    assert [is_reader(p) for p in llm.prompts] == [False, False, False, True]
    assert result.trace == [f"Fact number {i} is noted." for i in range(3)]
    # Paper form: each follow-up query is the previous sentence alone.
    assert retriever.query_texts == [QUESTION, "Fact number 0 is noted.", "Fact number 1 is noted."]
    # The reader sees exactly the passages gathered.
    assert llm.prompts[-1].startswith(format_passages(result.passages))
    assert llm.calls[-1].max_tokens == single_step_prompt.PROMPT.max_tokens


def test_ircot_min_steps_retrieves_with_an_early_answers_claim() -> None:
    def reply(prompt: str) -> str:
        if is_reader(prompt):
            return "Answer: 1946"
        if prompt.endswith("Reasoning: Jaws was directed by Steven Spielberg."):
            return "Spielberg was born in 1946. So the answer is: 1946"
        return "Jaws was directed by Steven Spielberg. So the answer is: Steven Spielberg"

    llm = FakeLLM(reply)
    retriever = FakeRetriever(per_query_passages(2))
    result = IRCoT(retriever, llm, top_k=2, max_steps=4, max_passages=10, min_steps=2).run(QUESTION)
    # round 1's answer is too early: its claim becomes the next query, round 2 may answer
    assert retriever.query_texts == [QUESTION, "Jaws was directed by Steven Spielberg."]
    assert (result.steps, result.answer) == (2, "1946")
    assert len(llm.calls) == 2


def test_ircot_reader_answers_from_every_gathered_passage() -> None:
    def reply(prompt: str) -> str:
        if is_reader(prompt):
            return "Steven Spielberg"
        return "Spielberg was born first. So the answer is: the director of Jaws, Spielberg"

    llm = FakeLLM(reply)
    result = IRCoT(FakeRetriever(make_passages(3)), llm, reader_answers=True).run(QUESTION)
    assert result.answer == "Steven Spielberg"
    assert [is_reader(p) for p in llm.prompts] == [False, True]
    assert llm.prompts[-1].startswith(format_passages(result.passages))


def test_ircot_query_with_question() -> None:
    llm = FakeLLM(["First fact here.", "Second fact here.", "So the answer is: X"])
    retriever = FakeRetriever(make_passages(3))
    IRCoT(retriever, llm, max_steps=5, query_with_question=True).run("Q?")
    assert retriever.query_texts == ["Q?", "Q? First fact here.", "Q? Second fact here."]


def test_ircot_stops_on_a_repeated_sentence() -> None:
    llm = FakeLLM(["Carrie is a novel.", "Carrie is a novel. Again.", "Answer: King"])
    retriever = FakeRetriever(make_passages(3))
    result = IRCoT(retriever, llm, max_steps=6).run(QUESTION)
    assert result.steps == 2
    assert len(retriever.queries) == 2
    assert result.trace == ["Carrie is a novel."]
    assert result.answer == "King"
    assert is_reader(llm.prompts[-1]) and len(llm.calls) == 3


@pytest.mark.parametrize("empty", ["", "   ", "1.", "- "])
def test_ircot_stops_on_an_empty_sentence(empty: str) -> None:
    llm = FakeLLM([empty, "Answer: nobody"])
    retriever = FakeRetriever(make_passages(3))
    result = IRCoT(retriever, llm, max_steps=4).run(QUESTION)
    assert result.steps == 1
    assert result.trace == []
    assert result.answer == "nobody"
    assert len(retriever.queries) == 1


def test_ircot_empty_answer_after_marker_falls_back_to_reader() -> None:
    llm = FakeLLM(["So the answer is:", "Answer: Paris"])
    result = IRCoT(FakeRetriever(make_passages(2)), llm, max_steps=4).run("Q?")
    assert result.answer == "Paris"
    assert result.steps == 1
    assert is_reader(llm.prompts[-1])


def test_ircot_passages_bounded_and_deduplicated() -> None:
    sentences = iter(["Alpha fact.", "Beta fact.", "Gamma fact.", "Delta fact.", "Epsilon."])

    def reply(prompt: str) -> str:
        return "Answer: done" if is_reader(prompt) else next(sentences)

    def search(query: str, k: int) -> list[Passage]:
        # Overlapping results: every query returns "shared" first, then its own passages.
        return [Passage("shared", "Shared", "shared text"), *make_passages(k, prefix=query[:5])]

    retriever = FakeRetriever(search)
    result = IRCoT(retriever, FakeLLM(reply), top_k=3, max_steps=5, max_passages=7).run("Q?")
    result_ids = [p.id for p in result.passages]
    assert len(result_ids) == 7
    assert len(set(result_ids)) == len(result_ids)
    assert result_ids[0] == "shared"
    assert result.steps == 5


def test_ircot_max_steps_one() -> None:
    llm = FakeLLM(["Something true.", "Answer: Y"])
    result = IRCoT(FakeRetriever(make_passages(2)), llm, max_steps=1).run("Q?")
    assert result.steps == 1 and result.answer == "Y"


# --- Decompose ------------------------------------------------------------------------------------

HEAT = "Who is the mother of the director of the film Heat?"


def test_parse_subquestions_strips_markers_and_drops_unrelated_lines() -> None:
    text = (
        "1. Who directed the film Heat?\n"
        "2) Who is the mother of Michael Mann?\n"
        "- What is the capital of France?\n"
    )
    assert parse_subquestions(text, HEAT, 3) == [
        "Who directed the film Heat?",
        "Who is the mother of Michael Mann?",
    ]


@pytest.mark.parametrize("marker", ["- ", "* ", "\u2022 ", "1. ", "12) ", "Q1: ", "q. ", "  3. "])
def test_parse_subquestions_list_markers(marker: str) -> None:
    assert parse_subquestions(f"{marker}Heat director?", HEAT, 3) == ["Heat director?"]


def test_parse_subquestions_at_most_limit_and_distinct() -> None:
    text = "\n".join([
        "Heat director?", "Heat director?", "Heat year?", "Heat mother?", "Heat cast?", "Heat plot?",
    ])
    assert parse_subquestions(text, HEAT, 3) == ["Heat director?", "Heat year?", "Heat mother?"]
    assert parse_subquestions(text, HEAT, 1) == ["Heat director?"]


def test_parse_subquestions_drops_the_question_itself() -> None:
    text = f"{HEAT}\n{HEAT.upper()}\n  - {HEAT}\nWho directed Heat?"
    assert parse_subquestions(text, HEAT, 3) == ["Who directed Heat?"]


def test_parse_subquestions_function_words_do_not_count_as_shared() -> None:
    # Shares only "who", "is", "the", "of" with the question: no content word.
    assert parse_subquestions("Who is the king of Spain?", HEAT, 3) == []
    assert parse_subquestions("", HEAT, 3) == []


def test_decompose_can_keep_the_questions_own_hits_whole() -> None:
    llm = FakeLLM(["Who directed the film Heat?\nWho is the mother of Michael Mann?", "Esther"])
    retriever = FakeRetriever(per_query_passages(5))
    result = Decompose(retriever, llm, top_k=5, max_passages=9, question_hits_first=True).run(HEAT)
    # the question first, as many as it could keep (its top_k + 1), before the split
    assert [k for _, k in retriever.queries] == [6, 2, 2]
    assert result.passages[:5] == per_query_passages(5)(HEAT, 5)
    assert len(result.passages) == 9


def test_decompose_runs_one_search_per_subquestion() -> None:
    llm = FakeLLM([
        "1. Who directed the film Heat?\n2. Who is the mother of Michael Mann?\n"
        "3. What is the capital of France?",
        "Answer: Esther Mann.",
    ])
    retriever = FakeRetriever(per_query_passages(5))
    result = Decompose(retriever, llm, top_k=5, max_passages=8).run(HEAT)
    assert result.strategy == "decompose"
    assert result.trace == ["Who directed the film Heat?", "Who is the mother of Michael Mann?"]
    assert result.steps == 3
    assert retriever.query_texts == [HEAT, *result.trace]
    per_query = max(2, 5 // 3 + 1)
    assert [k for _, k in retriever.queries] == [6, per_query, per_query]
    assert result.passages[:per_query] == per_query_passages(5)(HEAT, 5)[:per_query]
    assert result.answer == "Esther Mann"
    assert len(llm.calls) == 2
    assert DECOMPOSE_MARK in llm.prompts[0]
    assert llm.prompts[0].endswith(f"Question: {HEAT}\n")
    assert llm.calls[0].max_tokens == decompose_prompt.PROMPT.max_tokens
    assert llm.calls[0].stop == decompose_prompt.PROMPT.stop
    assert is_reader(llm.prompts[1])
    assert llm.prompts[1].startswith(format_passages(result.passages))
    # The question's own hits come first.
    assert result.passages[:per_query] == per_query_passages(5)(HEAT, per_query)[:per_query]
    assert_timings(result, {"retrieve", "generate"})


def test_decompose_without_subquestions_is_one_step() -> None:
    llm = FakeLLM([HEAT, "Answer: X"])
    retriever = FakeRetriever(make_passages(10))
    result = Decompose(retriever, llm, top_k=5, max_passages=8).run(HEAT)
    assert result.steps == 1
    assert result.trace == []
    assert len(retriever.queries) == 1


def test_decompose_uses_at_most_three_subquestions() -> None:
    subs = "\n".join(f"Heat question {i}?" for i in range(6))
    llm = FakeLLM([subs, "Answer: X"])
    retriever = FakeRetriever(per_query_passages(5))
    result = Decompose(retriever, llm, top_k=5, max_passages=50).run(HEAT)
    assert result.steps == 1 + decompose_prompt.MAX_SUBQUESTIONS == 4
    assert len(retriever.queries) == 4


def test_decompose_passages_bounded_and_deduplicated() -> None:
    def search(query: str, k: int) -> list[Passage]:
        return [Passage("shared", "S", "s"), *make_passages(k, prefix=query[:6])]

    llm = FakeLLM(["Heat alpha?\nHeat beta?\nHeat gamma?", "Answer: X"])
    result = Decompose(FakeRetriever(search), llm, top_k=12, max_passages=6).run(HEAT)
    result_ids = [p.id for p in result.passages]
    assert len(result_ids) <= 6
    assert len(set(result_ids)) == len(result_ids)


@pytest.mark.parametrize(("top_k", "max_passages"), [(10, 6), (5, 1)])
def test_decompose_never_exceeds_max_passages(top_k: int, max_passages: int) -> None:
    llm = FakeLLM([HEAT, "Answer: X"])  # the model repeats the question: no sub-question
    retriever = FakeRetriever(make_passages(20))
    result = Decompose(retriever, llm, top_k=top_k, max_passages=max_passages).run(HEAT)
    assert len(result.passages) <= max_passages


# --- factory and tiers ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_build_strategy_every_name(name: str) -> None:
    settings = Settings(_env_file=None, top_k=3, max_steps=2, max_passages=4)

    def reply(prompt: str) -> str:
        return "So the answer is: Z" if is_ircot(prompt) else "Answer: Z"

    llm, retriever = FakeLLM(reply), FakeRetriever(make_passages(10))
    strategy = build_strategy(name, retriever, llm, settings)
    assert strategy.name == name
    result = strategy.run("Heat?")
    assert result.strategy == name
    assert result.answer == "Z"
    if name != "no_retrieval":
        assert retriever.queries
    if name in ("single_step", "ircot"):
        assert retriever.queries[0] == ("Heat?", 3)
    whole = getattr(strategy, "whole", strategy)  # the multi-step ones read a two-part question by parts
    if name == "ircot":
        assert (whole.max_steps, whole.max_passages, whole.top_k) == (2, 4, 3)
    if name == "decompose":
        assert (whole.max_passages, whole.top_k) == (4, 3)


def test_build_strategy_unknown_name(settings) -> None:
    with pytest.raises(ValueError, match="unknown strategy 'magic'.*no_retrieval"):
        build_strategy("magic", FakeRetriever(), FakeLLM(), settings)


@pytest.mark.parametrize("multi_step", ["ircot", "decompose"])
def test_strategy_for_tier(multi_step: str) -> None:
    settings = Settings(_env_file=None, multi_step=multi_step)
    assert strategy_for_tier(Tier.A, settings) == "no_retrieval"
    assert strategy_for_tier(Tier.B, settings) == "single_step"
    assert strategy_for_tier(Tier.C, settings) == multi_step
