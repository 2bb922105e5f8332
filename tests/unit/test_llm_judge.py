"""The LLM-judge router: one call with the tier descriptions, a robustly parsed letter, B when the
answer names no tier or the LLM fails; an async adapter for the front door's router port."""

from __future__ import annotations

import asyncio

import pytest
from fakes import FakeLLM

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.errors import LLMUnavailableError
from adaptive_rag.prompts import router_judge
from adaptive_rag.routers.llm_judge import (
    MODEL_NAME,
    UNPARSED,
    AsyncLLMJudge,
    LLMJudge,
    parse_tier,
)


@pytest.mark.parametrize(("reply", "tier"), [
    ("C", Tier.C), ("Tier C", Tier.C), ("c)", Tier.C), (" B\n", Tier.B), ("(A)", Tier.A),
    ("Tier: b", Tier.B), ("Answer: A", Tier.A), ("A.", Tier.A), ("C) multi step: search several", Tier.C),
    ("B - single step", Tier.B), ("I would pick C.", Tier.C), ("multi-step", Tier.C),
    ("This needs tier C because it chains facts", Tier.C), ("a", Tier.A),
])
def test_parse_tier_reads_the_letter(reply: str, tier: Tier) -> None:
    assert parse_tier(reply) is tier


@pytest.mark.parametrize("reply", [
    "", "   ", "hello world", "A simple question", "I don't know", "a or b", "???", "Paris",
])
def test_parse_tier_refuses_garbage(reply: str) -> None:
    assert parse_tier(reply) is None


@pytest.mark.parametrize(("reply", "tier"), [("C", Tier.C), ("Tier A", Tier.A), ("b)", Tier.B)])
def test_route_returns_the_judges_tier(reply: str, tier: Tier) -> None:
    llm = FakeLLM([reply], prompt_style="chat")
    decision = LLMJudge(llm).route("Who was born first, the director of Jaws or the author of Carrie?")
    assert isinstance(decision, RoutingDecision)
    assert decision.tier is tier and decision.model_name == MODEL_NAME
    assert not decision.fallback and decision.probabilities is None
    assert decision.classify_ms >= 0.0
    # one call, with every tier's description and the question
    assert len(llm.calls) == 1
    for text in router_judge.TIER_DESCRIPTIONS.values():
        assert text in llm.prompts[0]
    assert llm.prompts[0].endswith("the author of Carrie?")


def test_garbage_falls_back_to_b_with_reason_unparsed() -> None:
    decision = LLMJudge(FakeLLM(["the moon is made of cheese"])).route("q?")
    assert decision.tier is Tier.B and decision.reason.startswith(UNPARSED)
    assert decision.model_name == MODEL_NAME


def test_a_failing_llm_is_a_flagged_fallback_not_an_exception() -> None:
    def broken(prompt: str) -> str:
        raise LLMUnavailableError("endpoint down")

    decision = LLMJudge(FakeLLM(broken)).route("q?")
    assert decision.tier is Tier.B and decision.fallback and "LLMUnavailableError" in decision.reason


def test_the_completion_form_ends_at_the_tier_slot() -> None:
    llm = FakeLLM([" C"])
    assert LLMJudge(llm).route("Which came first?").tier is Tier.C
    assert llm.prompts[0].endswith("Question: Which came first?\nTier:")
    assert llm.calls[0].stop == router_judge.PROMPT.stop


def test_async_adapter_serves_the_router_port() -> None:
    adapter = LLMJudge(FakeLLM(["A"])).as_async()
    assert isinstance(adapter, AsyncLLMJudge)
    decision = asyncio.run(adapter.route("What is the capital of France?"))
    assert decision.tier is Tier.A and decision.model_name == MODEL_NAME


def test_the_prompt_has_both_forms_with_every_tier() -> None:
    text = router_judge.PROMPT.text(question="Q?")
    messages = router_judge.PROMPT.messages(question="Q?")
    assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * len(router_judge.PROMPT.examples), "user"]
    assert messages[-1]["content"] == "Q?"
    for letter, description in router_judge.TIER_DESCRIPTIONS.items():
        assert f"{letter} = {description}" in text and description in messages[0]["content"]
    assert {tier for _, tier in router_judge.PROMPT.examples} == {"A", "B", "C"}


def test_the_judge_as_an_evaluation_row_counts_its_call_and_replays_its_routes(tmp_path) -> None:
    from adaptive_rag.evaluation.adaptive import LLM_JUDGE, llm_judge_row, replayed_row, route_row, save_routes
    from adaptive_rag.evaluation.datasets import Question
    from adaptive_rag.evaluation.runner import Outcome

    tiers = ("no_retrieval", "single_step", "ircot")
    questions = [Question("1", "squad", "Who wrote Carrie?", ("x",)),
                 Question("2", "hotpotqa", "Who was born first, A or B?", ("x",))]
    outcomes = {(q.dataset, q.id, name): Outcome(q.id, q.dataset, name, name, rank, 1.0 + rank, 0.0, 0.0, 0.0)
                for q in questions for rank, name in enumerate(tiers)}
    llm = FakeLLM(lambda prompt: "C" if "born first" in prompt else "I think no retrieval", prompt_style="chat")
    row = llm_judge_row(LLMJudge(llm), "qwen-1.5b")
    routed = route_row(row, outcomes, questions, tiers)
    assert routed.tiers == {("squad", "1"): Tier.A, ("hotpotqa", "2"): Tier.C} and len(llm.calls) == 2
    # The judge's own call is part of the answer's time.
    by_question = {o.question_id: o for o in routed.outcomes}
    assert by_question["2"].seconds == pytest.approx(3.0 + routed.seconds[("hotpotqa", "2")])
    assert all(o.strategy == LLM_JUDGE for o in routed.outcomes)

    save_routes(tmp_path / "routes.json", row, routed)
    replayed = replayed_row(tmp_path / "routes.json", LLM_JUDGE)
    again = route_row(replayed, outcomes, questions, tiers)
    assert again.tiers == routed.tiers and len(llm.calls) == 2  # replayed: the LLM is not asked
    assert "replayed" in replayed.label and "LLM judge's recorded routes" in replayed.description
