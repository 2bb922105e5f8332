"""Tier B: one BM25 retrieval, then `LLM(q, passages)`; one step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.prompts import format_passages
from adaptive_rag.prompts import single_step as prompt
from adaptive_rag.strategies.base import PhaseTimer, clean_answer


def read_answer(llm: LLM, question: str, passages: Sequence[Passage]) -> str:
    """The shared reader: answer `question` from `passages` in a few words."""
    completion = llm.generate(
        prompt.PROMPT.format(passages=format_passages(passages), question=question),
        prompt.MAX_TOKENS,
        prompt.STOP,
    )
    return clean_answer(completion.text)


@dataclass
class SingleStep:
    retriever: Retriever
    llm: LLM
    top_k: int = 5
    name: str = "single_step"

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("retrieve"):
            passages = self.retriever.search(question, self.top_k)
        with timer.phase("generate"):
            answer = read_answer(self.llm, question, passages)
        return StrategyResult(
            strategy=self.name, answer=answer, steps=1, passages=passages, timings=timer.finish()
        )
