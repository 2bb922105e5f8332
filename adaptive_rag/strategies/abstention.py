"""When a retrieving strategy hands the question to a human instead of answering it.

Checked on the question's own retrieval, before the reader runs (so an abstention costs one
search, never an LLM call), in this order:
- nothing retrieved: always abstain, whatever the thresholds (the reader would answer from its
  own memory, as if the tenant's documents said so);
- `min_score` > 0 (`ARAG_ABSTAIN_MIN_SCORE`): no passage's raw BM25 score reaches it;
- `min_relevance` > 0: the best passage's relevance (`retrieval.relevance`) is below it. Each
  knowledge base gets its own threshold when it is imported (`knowledge.calibration`), unless
  an operator overrides it; the worker passes the one in effect.
An abstaining result keeps the passages it found: the closest sources, for the human agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.ports import Retriever
from adaptive_rag.retrieval.relevance import relevance

NO_PASSAGE = "nothing in the knowledge base matches the question"
BELOW_THRESHOLD = "no passage above the retrieval threshold"


def below_relevance(found: float, threshold: float) -> str:
    """The reason given when the closest passage is not relevant enough."""
    return (f"the knowledge base does not cover the question: the closest passage's relevance "
            f"{found:.2f} is below its threshold {threshold:.2f}")


@dataclass(frozen=True)
class Abstention:
    """The thresholds a retrieving strategy abstains below (0: that check is off)."""

    min_relevance: float = 0.0
    min_score: float = 0.0

    def reason(self, retriever: Retriever, question: str, passages: Sequence[Passage]) -> str | None:
        """Why the strategy must abstain on `question` given its own retrieval, or None."""
        if not passages:
            return NO_PASSAGE
        if self.min_score > 0 and not any(p.score >= self.min_score for p in passages):
            return BELOW_THRESHOLD
        if self.min_relevance > 0:
            found = relevance(retriever, question, passages)
            if found is not None and found < self.min_relevance:
                return below_relevance(found, self.min_relevance)
        return None


def abstained(strategy: str, passages: Sequence[Passage], steps: int, timings: dict[str, float],
              reason: str, trace: Sequence[str] = ()) -> StrategyResult:
    """The result of a strategy that declined to answer: no answer, the reason, the sources."""
    return StrategyResult(strategy=strategy, answer="", steps=steps, passages=list(passages),
                          timings=timings, trace=list(trace), answerable=False, abstain_reason=reason)
