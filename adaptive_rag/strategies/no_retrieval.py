"""Tier A: answer from the LLM alone (`LLM(q)`); zero retrieval steps."""

from __future__ import annotations

from dataclasses import dataclass

from adaptive_rag.contracts import StrategyName
from adaptive_rag.domain import StrategyResult
from adaptive_rag.ports import LLM
from adaptive_rag.prompts import no_retrieval as prompt
from adaptive_rag.strategies.base import PhaseTimer, ask, clean_answer


@dataclass
class NoRetrieval:
    llm: LLM
    name: str = StrategyName.NO_RETRIEVAL

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("generate"):
            completion = ask(self.llm, prompt.PROMPT, question=question)
        return StrategyResult(
            strategy=self.name, answer=clean_answer(completion.text), steps=0,
            timings=timer.finish(),
        )
