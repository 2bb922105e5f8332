"""Tier B: one BM25 retrieval, then `LLM(q, passages)`; one step.

Support semantics, both off by default so benchmark runs are unchanged: with `min_score` > 0 the
strategy abstains without calling the LLM when no retrieved passage scores at least `min_score`
(BM25: nothing in the knowledge base shares enough rare terms with the question); with
`reader_abstains` the reader gets a prompt that lets it say the passages lack the answer, and
saying so abstains too. An abstaining result has `answerable=False`, an empty answer and the
reason, so the caller can hand the query to a human.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from adaptive_rag.contracts import StrategyName
from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.prompts import Prompt, format_passages
from adaptive_rag.prompts import single_step as prompt
from adaptive_rag.strategies.base import PhaseTimer, ask, clean_answer

BELOW_THRESHOLD = "no passage above the retrieval threshold"
READER_FOUND_NONE = "the reader found no answer in the passages"
_NON_WORD = re.compile(r"[^\w]+")


def read_answer(
    llm: LLM, question: str, passages: Sequence[Passage], template: Prompt = prompt.PROMPT
) -> str:
    """The shared reader: answer `question` from `passages` in a few words."""
    completion = ask(llm, template, passages=format_passages(passages), question=question)
    return clean_answer(completion.text)


def _words(text: str) -> str:
    return " ".join(_NON_WORD.sub(" ", text.lower()).split())


def says_no_answer(answer: str) -> bool:
    """True when the reader wrote the no-answer marker (any case or punctuation around it)."""
    return _words(prompt.NO_ANSWER_MARKER) in _words(answer)


@dataclass
class SingleStep:
    retriever: Retriever
    llm: LLM
    top_k: int = 5
    name: str = StrategyName.SINGLE_STEP
    # Abstain when no passage scores at least this (0 disables: the reader always runs).
    min_score: float = 0.0
    # Let the reader abstain with `prompts.single_step.NO_ANSWER_MARKER`.
    reader_abstains: bool = False

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("retrieve"):
            passages = self.retriever.search(question, self.top_k)
        if self.min_score > 0 and not any(p.score >= self.min_score for p in passages):
            return StrategyResult(
                strategy=self.name, answer="", steps=1, passages=passages,
                timings=timer.finish(), answerable=False, abstain_reason=BELOW_THRESHOLD,
            )
        template = prompt.ABSTAIN if self.reader_abstains else prompt.PROMPT
        with timer.phase("generate"):
            answer = read_answer(self.llm, question, passages, template)
        if self.reader_abstains and says_no_answer(answer):
            return StrategyResult(
                strategy=self.name, answer="", steps=1, passages=passages,
                timings=timer.finish(), answerable=False, abstain_reason=READER_FOUND_NONE,
            )
        return StrategyResult(
            strategy=self.name, answer=answer, steps=1, passages=passages, timings=timer.finish()
        )
