"""Uncertainty-triggered retrieval: the no-retrieval draft's token probabilities decide whether the
single step runs; a triggered question pays for both; the threshold is tuned on train examples."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pytest
from fakes import FakeLLM, FakeRetriever, make_passages

from adaptive_rag.domain import Completion, StrategyResult
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.llm import logprob_llm
from adaptive_rag.llm.llama_cpp import text_logprobs
from adaptive_rag.prompts import no_retrieval
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import SingleStep, Uncertainty, build_strategy
from adaptive_rag.strategies.uncertainty import (
    KEPT,
    TRIGGERED,
    DraftExample,
    candidate_thresholds,
    confidence,
    evaluate_threshold,
    tune_threshold,
)


class LogprobLLM:
    """Scripted drafts with token probabilities: each reply is (text, [p per token])."""

    logprobs = True

    def __init__(self, replies: Sequence[tuple[str, Sequence[float] | None]], prompt_style: str = "chat") -> None:
        self.prompt_style = prompt_style
        self._replies = list(replies)
        self.prompts: list[str] = []

    def generate(self, prompt: str, max_tokens: int, stop: Sequence[str] = ()) -> Completion:
        self.prompts.append(prompt)
        text, probs = self._replies.pop(0)
        logprobs = None if probs is None else [math.log(p) for p in probs]
        return Completion(text=text, completion_tokens=len(probs or ()), token_logprobs=logprobs)

    def chat(self, messages: Sequence[Mapping[str, str]], max_tokens: int, stop: Sequence[str] = ()) -> Completion:
        return self.generate("\n\n".join(m["content"] for m in messages), max_tokens, stop)


def strategy(draft: tuple[str, Sequence[float] | None], threshold: float = 0.5, aggregate: str = "min",
             reader: Sequence[str] = ()) -> tuple[Uncertainty, FakeLLM, FakeRetriever]:
    llm, retriever = FakeLLM(list(reader)), FakeRetriever(make_passages(3))
    single = SingleStep(retriever, llm, top_k=3)
    return Uncertainty(LogprobLLM([draft]), single, threshold, aggregate), llm, retriever  # type: ignore[arg-type]


def test_a_confident_draft_is_the_answer_without_retrieval() -> None:
    unc, reader, retriever = strategy(("Jane Austen", [0.9, 0.8]), threshold=0.5)
    result = unc.run("Who wrote Pride and Prejudice?")
    assert (result.strategy, result.answer, result.steps) == ("uncertainty", "Jane Austen", 0)
    assert result.trace[0] == KEPT and result.passages == []
    assert retriever.queries == [] and reader.calls == []
    assert set(result.timings) == {"generate", "total"}


def test_an_unsure_draft_retrieves_and_single_step_answers() -> None:
    unc, reader, retriever = strategy(("Sydney", [0.9, 0.3]), threshold=0.5, reader=["Canberra"])
    result = unc.run("What is the capital of Australia?")
    assert result.answer == "Canberra" and result.steps == 1
    assert result.trace[0] == TRIGGERED and "Sydney" in result.trace[1]
    assert retriever.query_texts == ["What is the capital of Australia?"]
    assert len(reader.calls) == 1 and len(result.passages) == 3
    assert {"retrieve", "generate", "total"} <= set(result.timings)


class FixedSingle:
    """A single-step stand-in with known cost: 1 step, 2 s retrieving, 3 s generating."""

    name = "single_step"

    def run(self, question: str) -> StrategyResult:
        return StrategyResult(strategy=self.name, answer="Canberra", steps=1,
                              timings={"retrieve": 2.0, "generate": 3.0, "total": 5.0})


def test_a_triggered_question_pays_for_the_draft_and_the_single_step() -> None:
    unc = Uncertainty(LogprobLLM([("Sydney", [0.2])]), FixedSingle(), threshold=0.5)  # type: ignore[arg-type]
    result = unc.run("What is the capital of Australia?")
    assert result.answer == "Canberra" and result.steps == 1
    assert 2.0 == result.timings["retrieve"]
    assert 3.0 < result.timings["generate"] < 3.5  # B's 3 s plus the (real, tiny) draft
    assert 5.0 < result.timings["total"] < 5.5


def test_the_threshold_is_strict_at_the_boundary_and_aggregates_differ() -> None:
    # min 0.4: kept at threshold 0.4, triggered at 0.41
    assert strategy(("x", [0.4, 1.0]), threshold=0.4)[0].run("q").trace[0] == KEPT
    assert strategy(("x", [0.4, 1.0]), threshold=0.41, reader=["y"])[0].run("q").trace[0] == TRIGGERED
    # mean of (0.4, 1.0) is 0.7: kept with the mean, triggered with the min
    assert strategy(("x", [0.4, 1.0]), threshold=0.6, aggregate="mean")[0].run("q").trace[0] == KEPT
    assert strategy(("x", [0.4, 1.0]), threshold=0.6, reader=["y"])[0].run("q").trace[0] == TRIGGERED


@pytest.mark.parametrize("draft", [("", [0.99]), ("Paris", None), ("Paris", [])])
def test_an_empty_draft_or_no_logprobs_retrieves(draft) -> None:
    unc, reader, _ = strategy(draft, threshold=0.1, reader=["Paris"])
    result = unc.run("q")
    assert result.trace[0] == TRIGGERED and len(reader.calls) == 1


def test_the_draft_uses_the_no_retrieval_prompt_on_the_draft_llm() -> None:
    unc, _, _ = strategy(("Paris", [0.99]))
    unc.run("Capital of France?")
    assert unc.draft_llm.prompts[0].startswith(no_retrieval.PROMPT.system)  # type: ignore[attr-defined]


def test_draft_gives_the_answer_and_its_confidence_for_tuning() -> None:
    unc, reader, retriever = strategy(("Answer: Jane Austen", [0.9, 0.6]))
    assert unc.draft("Who wrote Emma?") == ("Jane Austen", pytest.approx(0.6), True)
    assert reader.calls == [] and retriever.queries == []


def test_confidence() -> None:
    lps = [math.log(0.5), math.log(0.9)]
    assert confidence(lps, "min") == pytest.approx(0.5)
    assert confidence(lps, "mean") == pytest.approx(0.7)
    assert confidence([], "min") == 0.0 and confidence(None) == 0.0


def test_a_draft_llm_without_logprobs_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="log-probabilities"):
        Uncertainty(FakeLLM(), SingleStep(FakeRetriever(), FakeLLM()))


def test_build_strategy_reuses_a_logprob_llm_and_reads_the_settings() -> None:
    llm = LogprobLLM([])
    settings = Settings(uncertainty_threshold=0.3, uncertainty_aggregate="mean")
    unc = build_strategy("uncertainty", FakeRetriever(), llm, settings)  # type: ignore[arg-type]
    assert isinstance(unc, Uncertainty) and unc.draft_llm is llm
    assert (unc.threshold, unc.aggregate) == (0.3, "mean")
    assert isinstance(unc.single, SingleStep) and unc.single.llm is llm


def test_logprob_llm_builds_one_shared_logprob_instance(monkeypatch) -> None:
    import adaptive_rag.llm as llm_module

    built: list[bool | None] = []

    def fake_build(settings, *, logprobs=None):
        built.append(logprobs)
        return LogprobLLM([])

    monkeypatch.setattr(llm_module, "build_llm", fake_build)
    monkeypatch.setattr(llm_module, "_LOGPROB_LLMS", {})
    settings = Settings(gguf_path="/models/x.gguf")
    first = logprob_llm(settings, FakeLLM())  # FakeLLM reports no log-probabilities
    assert logprob_llm(settings, FakeLLM()) is first and built == [True]


def test_text_logprobs_drops_the_stop_token_past_the_text() -> None:
    # llama.cpp generated "Paris" then "\n" (the stop string, cut from the text)
    assert text_logprobs(["Par", "is", "\n"], [-0.1, -0.2, -3.0], "Paris") == [-0.1, -0.2]
    assert text_logprobs(["\n"], [-3.0], "") == []


# --- tuning the threshold on train -------------------------------------------------------------

# Confident drafts are right, unsure ones wrong (B right): the best threshold separates them.
EXAMPLES = [
    DraftExample(0.95, a_score=1.0, b_score=1.0),
    DraftExample(0.90, a_score=1.0, b_score=0.0),
    DraftExample(0.40, a_score=0.0, b_score=1.0),
    DraftExample(0.20, a_score=0.0, b_score=1.0),
    DraftExample(0.10, a_score=0.0, b_score=0.0),
]


def test_candidates_are_the_midpoints_and_the_ends() -> None:
    assert candidate_thresholds([0.2, 0.4, 0.4]) == pytest.approx([0.0, 0.3, 1.0])
    assert candidate_thresholds([1.0, 0.0]) == pytest.approx([0.0, 0.5, 1.0])
    assert candidate_thresholds([]) == [0.0, 1.0]


def test_evaluate_threshold_counts_a_plus_b_on_triggered_questions() -> None:
    score, cost, triggered = evaluate_threshold(0.5, EXAMPLES)
    assert score == pytest.approx((1 + 1 + 1 + 1 + 0) / 5)
    assert cost == pytest.approx(3 / 5) and triggered == pytest.approx(3 / 5)
    # a draft exactly at the threshold is kept: 0.4 does not retrieve at threshold 0.4
    assert evaluate_threshold(0.4, EXAMPLES)[2] == pytest.approx(2 / 5)
    steps_and_seconds = [DraftExample(0.1, 0, 1, a_cost=0.3, b_cost=2.0), DraftExample(0.9, 1, 1, a_cost=0.3, b_cost=2.0)]
    assert evaluate_threshold(0.5, steps_and_seconds)[1] == pytest.approx((0.3 + 2.0 + 0.3) / 2)


def test_tune_picks_the_separating_threshold_without_a_budget() -> None:
    choice = tune_threshold(EXAMPLES)
    assert 0.4 < choice.threshold < 0.9  # the midpoint 0.65: retrieve the three unsure ones
    assert choice.threshold == pytest.approx(0.65)
    assert choice.score == pytest.approx(0.8) and choice.triggered == pytest.approx(0.6)


def test_tune_respects_the_cost_budget() -> None:
    choice = tune_threshold(EXAMPLES, cost_budget=0.4)  # at most 2 of 5 may retrieve
    assert choice.cost <= 0.4
    assert choice.threshold == pytest.approx(0.3)  # retrieve 0.2 and 0.1: F1 0.6, the best within
    assert choice.score == pytest.approx(0.6)
    never = tune_threshold(EXAMPLES, cost_budget=0.0)
    assert never.threshold == 0.0 and never.triggered == 0.0


def test_tune_ties_go_to_the_cheaper_threshold() -> None:
    same = [DraftExample(0.3, 1.0, 1.0), DraftExample(0.7, 1.0, 1.0)]
    assert tune_threshold(same).threshold == 0.0  # retrieving buys nothing


def test_tune_reports_an_unmeetable_budget() -> None:
    costly = [DraftExample(0.5, 1.0, 1.0, a_cost=1.0)]  # the draft alone exceeds the budget
    choice = tune_threshold(costly, cost_budget=0.5)
    assert choice.threshold == 0.0 and "no threshold met the budget" in choice.note


# --- tuning on train questions (`arag routers tune-uncertainty`) -------------------------------


def test_tuning_collects_drafts_once_and_picks_the_threshold_by_f1_within_the_budget(tmp_path) -> None:
    from adaptive_rag.evaluation.datasets import Question
    from adaptive_rag.evaluation.runner import Outcome
    from adaptive_rag.evaluation.uncertainty_tuning import collect_drafts, draft_examples, tune

    questions = [Question(str(i), "nq", f"q{i}?", (answer,)) for i, answer in enumerate(["paris", "rome", "oslo"])]
    # Confident and right; unsure and wrong; unsure and right (min probabilities 0.9, 0.2, 0.3).
    drafts_llm = LogprobLLM([("Paris", [0.9, 0.95]), ("Milan", [0.2, 0.9]), ("Oslo", [0.3, 0.4])])
    drafter = Uncertainty(drafts_llm, SingleStep(FakeRetriever(make_passages(3)), FakeLLM([]), top_k=3))  # type: ignore[arg-type]
    path = tmp_path / "drafts.jsonl"
    drafts = collect_drafts(questions, drafter, path)
    assert [d.f1 for d in drafts.values()] == [1.0, 0.0, 1.0]
    assert collect_drafts(questions, drafter, path) == drafts  # resumed: no second call (the script is empty)
    single = {("nq", str(i)): Outcome(str(i), "nq", "single_step", "x", 1, 2.0, 0.0, f1, 0.0)
              for i, f1 in enumerate([1.0, 1.0, 0.0])}
    examples = draft_examples(drafts, single, "min", cost="steps")
    assert [(round(e.confidence, 2), e.a_score, e.b_score, e.b_cost) for e in examples] == [
        (0.9, 1.0, 1.0, 1.0), (0.2, 0.0, 1.0, 1.0), (0.3, 1.0, 0.0, 1.0)]
    best = {t.aggregate: t for t in tune(drafts, single, cost="steps")}["min"]
    # Retrieving below 0.25 (only the second question) answers all three.
    assert 0.2 < best.choice.threshold < 0.3 and best.choice.score == pytest.approx(1.0)
    assert best.choice.triggered == pytest.approx(1 / 3)
    assert best.always_a["f1"] == pytest.approx(2 / 3) and best.always_b["f1"] == pytest.approx(2 / 3)
    # A budget of no retrieval at all: the cheapest threshold, 0.
    assert tune(drafts, single, aggregates=("min",), cost="steps", budget=0.0)[0].choice.threshold == 0.0
