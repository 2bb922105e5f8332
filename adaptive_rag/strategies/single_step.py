"""Tier B: one BM25 retrieval, then `LLM(q, passages)`; one step.

Support semantics: the strategy abstains without calling the LLM when its retrieval found nothing
or nothing relevant enough (`strategies.abstention`; thresholds off by default, so benchmark runs
are unchanged); with `reader_abstains` the reader gets a prompt that lets it say the passages lack
the answer, and saying so abstains too. An abstaining result has `answerable=False`, an empty
answer, the reason and the passages found, so the caller can hand the query to a human.
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
from adaptive_rag.strategies.abstention import Abstention, abstained
from adaptive_rag.strategies.base import PhaseTimer, ask, clean_answer

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
    # When to abstain before the reader runs (always when nothing is retrieved).
    abstention: Abstention = Abstention()
    # Let the reader abstain with `prompts.single_step.NO_ANSWER_MARKER`.
    reader_abstains: bool = False

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("retrieve"):
            passages = self.retriever.search(question, self.top_k)
        why = self.abstention.reason(self.retriever, question, passages)
        if why is not None:
            return abstained(self.name, passages, 1, timer.finish(), why)
        template = prompt.ABSTAIN if self.reader_abstains else prompt.PROMPT
        with timer.phase("generate"):
            answer = read_answer(self.llm, question, passages, template)
        if self.reader_abstains and says_no_answer(answer):
            return abstained(self.name, passages, 1, timer.finish(), READER_FOUND_NONE)
        return StrategyResult(
            strategy=self.name, answer=answer, steps=1, passages=passages, timings=timer.finish()
        )
