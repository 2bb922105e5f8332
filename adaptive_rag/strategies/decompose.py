"""Tier C, decompose-retrieve-synthesize.

The question is retrieved first, and the strategy abstains there when nothing relevant came back
(`strategies.abstention`). Otherwise one generation splits the question into at most three
simple sub-questions; each sub-question is retrieved separately (one step each); the passages
are merged (bounded, question's own hits first) and the shared reader answers once. Cheaper and steadier than IRCoT for a small model
that does not follow the reasoning format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from adaptive_rag.contracts import AnswerStyle, StrategyName
from adaptive_rag.domain import StrategyResult
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.prompts import decompose as prompt
from adaptive_rag.strategies.abstention import Abstention, abstained
from adaptive_rag.strategies.base import PhaseTimer, ask, merge_passages
from adaptive_rag.strategies.single_step import answer_in_style

_LIST_PREFIX = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)]|q\d*[:.])\s*", re.IGNORECASE)


_WORD = re.compile(r"\w+")
_FUNCTION_WORDS = frozenset(
    ["what", "which", "who", "whom", "whose", "when", "where", "why", "how", "is", "was", "are", "were", "the", "a", "an", "of", "in", "on", "at", "to", "for", "by", "and", "or", "did", "does", "do", "from", "with", "that", "this", "film", "song"]
)


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _FUNCTION_WORDS and len(w) > 2}


def parse_subquestions(text: str, question: str, limit: int) -> list[str]:
    """Distinct lines of the model's output, list markers removed, at most `limit`.

    A line sharing no content word with the question is dropped: the small model sometimes
    copies a few-shot example ("What is the capital of France?") instead of decomposing.
    """
    subs: list[str] = []
    asked = content_words(question)
    for line in text.splitlines():
        line = _LIST_PREFIX.sub("", line).strip()
        if (
            line and line.lower() != question.lower() and line not in subs
            and content_words(line) & asked
        ):
            subs.append(line)
        if len(subs) >= limit:
            break
    return subs


@dataclass
class Decompose:
    retriever: Retriever
    llm: LLM
    top_k: int = 5
    max_passages: int = 8
    # True: the question's own top_k hits come first, the sub-questions' hits fill the room left
    # (a question the reader could answer in one step keeps its evidence); False: every query,
    # the question included, gets an equal share of the room.
    question_hits_first: bool = False
    # When to abstain, judged on the question's own retrieval before the split is generated.
    abstention: Abstention = Abstention()
    style: AnswerStyle = AnswerStyle.SHORT
    name: str = StrategyName.DECOMPOSE

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        # The question's own hits, as many as it can keep (`per_query` with no sub-question).
        with timer.phase("retrieve"):
            question_hits = self.retriever.search(question, max(2, self.top_k + 1))
        why = self.abstention.reason(self.retriever, question, question_hits)
        if why is not None:
            return abstained(self.name, question_hits[: self.top_k], 1, timer.finish(), why)
        with timer.phase("generate"):
            completion = ask(self.llm, prompt.PROMPT, question=question)
        subquestions = parse_subquestions(completion.text, question, prompt.MAX_SUBQUESTIONS)
        per_query = max(2, self.top_k // (len(subquestions) + 1) + 1)
        own = self.top_k if self.question_hits_first else per_query
        with timer.phase("retrieve"):
            passages = merge_passages([], question_hits[:own], self.max_passages)
            for sub in subquestions:
                passages = merge_passages(
                    passages, self.retriever.search(sub, per_query), self.max_passages
                )
        with timer.phase("generate"):
            answer = answer_in_style(self.llm, question, passages, self.style)
        return StrategyResult(
            strategy=self.name, answer=answer, steps=1 + len(subquestions), passages=passages,
            timings=timer.finish(), trace=subquestions,
        )
