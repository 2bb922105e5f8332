"""The LLM-driven routers once each on the REAL configured reader (llama.cpp) over a real tantivy
index of the demo knowledge base: Self-Route, uncertainty-triggered retrieval (with its
log-probability copy of the model) and the LLM judge. Structure only; quality is the evaluation
harness's business.

Run: `.venv/bin/python -m pytest tests/integration/test_router_strategies.py -m model`
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.evaluation.corpus import read_jsonl_corpus
from adaptive_rag.llm import build_llm, logprob_llm
from adaptive_rag.llm.llama_cpp import LlamaCppLLM, text_logprobs
from adaptive_rag.prompts import no_retrieval
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from adaptive_rag.routers.llm_judge import MODEL_NAME, LLMJudge
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import build_strategy
from adaptive_rag.strategies.self_route import ESCALATED, NOT_ESCALATED
from adaptive_rag.strategies.uncertainty import KEPT, TRIGGERED

pytestmark = pytest.mark.model

DEMO = Path(__file__).resolve().parents[2] / "demo"
# Short prompts: these tests check structure on 2 shared cores, not quality.
BOUNDS = {"top_k": 3, "max_passages": 4, "max_steps": 3}


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings().model_copy(update=BOUNDS)


@pytest.fixture(scope="module")
def llm(settings):
    model = build_llm(settings)
    assert isinstance(model, LlamaCppLLM), "these tests need the embedded model (unset LLM_BASE_URL)"
    assert not model.logprobs  # the shared reader stays without logits_all
    return model


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, settings) -> TantivyRetriever:
    return TantivyRetriever.build(
        tmp_path_factory.mktemp("demo-index") / "index",
        read_jsonl_corpus(DEMO / "knowledge_base.jsonl"), title_boost=settings.title_boost,
    )


@pytest.fixture(scope="module")
def questions() -> dict[str, list[str]]:
    by_tier: dict[str, list[str]] = {}
    for row in json.loads((DEMO / "questions.json").read_text(encoding="utf-8")):
        by_tier.setdefault(row["expected_tier"], []).append(row["question"])
    return by_tier


def test_self_route(llm, retriever, settings, questions) -> None:
    result = build_strategy("self_route", retriever, llm, settings).run(questions["C"][0])
    assert result.strategy == "self_route" and "\n" not in result.answer
    assert result.trace[0] in (ESCALATED, NOT_ESCALATED)
    if result.trace[0] == ESCALATED:
        assert result.steps >= 2
    else:
        assert result.steps == 1 and result.answer.strip()
    assert {"retrieve", "generate", "total"} <= set(result.timings)
    assert result.timings["total"] >= result.timings["generate"] > 0


def test_uncertainty(llm, retriever, settings, questions) -> None:
    strategy = build_strategy("uncertainty", retriever, llm, settings)
    assert strategy.draft_llm is not llm and strategy.draft_llm.logprobs
    result = strategy.run(questions["A"][1])
    assert result.strategy == "uncertainty"
    assert result.trace[0] in (KEPT, TRIGGERED)
    assert result.steps == (0 if result.trace[0] == KEPT else 1)
    assert result.timings["total"] >= result.timings["generate"] > 0


def test_logprobs_match_llama_cpps_own(llm, settings) -> None:
    """The log-probabilities read from the kept logits equal those llama-cpp-python computes."""
    drafter = logprob_llm(settings, llm)
    prompt = no_retrieval.PROMPT.text(question="What is the capital of France?")
    # Both calls evaluate the whole prompt: a cached prefix would re-evaluate its last token in a
    # batch of one, whose float rounding differs by a few hundredths.
    drafter._llama.reset()
    ours = drafter.generate(prompt, 8, no_retrieval.PROMPT.stop)
    drafter._llama.reset()
    theirs = drafter._llama.create_completion(
        prompt, max_tokens=8, temperature=0.0, top_k=1, stop=list(no_retrieval.PROMPT.stop), logprobs=1,
    )["choices"][0]
    block = theirs["logprobs"]
    assert ours.text == theirs["text"] and ours.token_logprobs
    expected = text_logprobs(block["tokens"], block["token_logprobs"], theirs["text"])
    assert ours.token_logprobs == pytest.approx(expected, abs=1e-3)
    assert all(lp <= 0 for lp in ours.token_logprobs)
    assert 0 < math.exp(min(ours.token_logprobs)) <= 1


def test_llm_judge(llm, questions) -> None:
    decision = LLMJudge(llm).route(questions["C"][0])
    assert decision.tier in set(Tier) and decision.model_name == MODEL_NAME
    assert decision.classify_ms > 0 and decision.reason
