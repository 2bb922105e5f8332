"""Every strategy once on the REAL embedded model (Gemma 3 270M GGUF via llama.cpp) over a real
tantivy index of the demo knowledge base. Only structural facts a real run must satisfy are
checked; answer quality is the evaluation harness's business.

Run: `.venv/bin/python -m pytest tests/integration/test_model_strategies.py -m model`
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptive_rag.domain import Completion, StrategyResult

from adaptive_rag.contracts import Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evaluation.corpus import read_jsonl_corpus
from adaptive_rag.llm import build_llm
from adaptive_rag.llm.llama_cpp import LlamaCppLLM
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import build_strategy

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo"


# Smaller bounds than the defaults keep the prompts short: on 2 shared cores the 270M model reads
# a 700-token prompt in ~10 s; these tests check structure, not quality.
BOUNDS = {"top_k": 3, "max_passages": 4, "max_steps": 3}


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings().model_copy(update=BOUNDS)


@pytest.fixture(scope="module")
def llm():
    model = build_llm(Settings())
    assert isinstance(model, LlamaCppLLM), "these tests need the embedded model (unset LLM_BASE_URL)"
    return model


@pytest.fixture(scope="module")
def kb() -> dict[str, str]:
    """Demo knowledge base: passage id -> title."""
    return {p.id: p.title for p in read_jsonl_corpus(DEMO / "knowledge_base.jsonl")}


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, settings) -> TantivyRetriever:
    return TantivyRetriever.build(
        tmp_path_factory.mktemp("demo-index") / "index",
        read_jsonl_corpus(DEMO / "knowledge_base.jsonl"),
        title_boost=settings.title_boost,
    )


@pytest.fixture(scope="module")
def demo_questions() -> dict[str, list[dict]]:
    by_tier: dict[str, list[dict]] = {}
    for row in json.loads((DEMO / "questions.json").read_text(encoding="utf-8")):
        by_tier.setdefault(row["expected_tier"], []).append(row)
    return by_tier


def question_for(demo_questions, tier: Tier) -> dict:
    return demo_questions[tier.value][1 if tier == Tier.A else 0]


def check_common(result: StrategyResult, name: str, kb: dict[str, str], phases: set[str]) -> None:
    assert result.strategy == name
    assert isinstance(result.answer, str)
    assert "\n" not in result.answer
    assert phases | {"total"} <= set(result.timings)
    assert all(v > 0 for v in result.timings.values()), result.timings
    assert result.timings["total"] >= max(result.timings[p] for p in phases)
    ids = [p.id for p in result.passages]
    assert len(ids) == len(set(ids))
    for p in result.passages:
        assert p.id in kb and p.title == kb[p.id]


def test_no_retrieval(llm, retriever, settings, kb, demo_questions) -> None:
    q = question_for(demo_questions, Tier.A)
    result = build_strategy("no_retrieval", retriever, llm, settings).run(q["question"])
    check_common(result, "no_retrieval", kb, {"generate"})
    assert result.steps == 0 and result.passages == []


def test_single_step(llm, retriever, settings, kb, demo_questions) -> None:
    q = question_for(demo_questions, Tier.B)
    result = build_strategy("single_step", retriever, llm, settings).run(q["question"])
    check_common(result, "single_step", kb, {"retrieve", "generate"})
    assert result.steps == 1
    assert result.answer.strip()
    assert 1 <= len(result.passages) <= settings.top_k
    assert set(q["needs"]) <= {p.id for p in result.passages}  # BM25 finds the warranty page


def test_ircot(llm, retriever, settings, kb, demo_questions) -> None:
    q = question_for(demo_questions, Tier.C)
    strategy = build_strategy("ircot", retriever, llm, settings)
    result = strategy.run(q["question"])
    check_common(result, "ircot", kb, {"retrieve", "generate"})
    assert 1 <= result.steps <= settings.max_steps
    assert len(result.trace) <= result.steps
    assert 1 <= len(result.passages) <= settings.max_passages


def test_decompose(llm, retriever, settings, kb, demo_questions) -> None:
    q = question_for(demo_questions, Tier.C)
    result = build_strategy("decompose", retriever, llm, settings).run(q["question"])
    check_common(result, "decompose", kb, {"retrieve", "generate"})
    assert 1 <= result.steps <= 4
    assert result.steps == 1 + len(result.trace)
    assert 1 <= len(result.passages) <= settings.max_passages


def test_generate_honours_max_tokens(llm) -> None:
    completion = llm.generate("Count slowly: one, two, three, four, five, six, seven,", 5)
    assert isinstance(completion, Completion)
    assert 1 <= completion.completion_tokens <= 5
    assert completion.prompt_tokens > 5


def test_generate_honours_stop_strings(llm) -> None:
    prompt = "Numbers from one to ten: one, two, three,"
    free = llm.generate(prompt, 16)
    assert "," in free.text, free.text  # the stop string would appear without the stop list
    stopped = llm.generate(prompt, 16, stop=(",",))
    assert "," not in stopped.text
    assert stopped.completion_tokens <= free.completion_tokens
    assert free.text.startswith(stopped.text)


def test_forgetting_the_context_drops_the_reused_prompt_and_changes_no_answer(llm) -> None:
    prompt = "Numbers from one to ten: one, two, three,"
    first = llm.generate(prompt, 8)
    assert llm._llama.n_tokens > 0  # llama.cpp keeps the evaluated tokens for prefix reuse
    llm.forget_context()
    assert llm._llama.n_tokens == 0
    assert llm.generate(prompt, 8).text == first.text


def test_missing_gguf_path_is_a_configuration_error(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="GGUF model not found"):
        LlamaCppLLM(tmp_path / "missing.gguf")
