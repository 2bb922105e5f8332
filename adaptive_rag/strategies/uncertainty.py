"""Uncertainty-triggered retrieval (the FLARE / DRAGIN family, at the granularity of one answer).

No retrieval (A) drafts the answer with token log-probabilities; when the draft's confidence (the
minimum, or the mean, probability of its tokens) falls below `threshold`, the single step (B)
retrieves and answers instead. The draft is always paid for: a triggered question costs A + B
(steps: B's; timings: both runs), an untriggered one costs A. The first trace line says which.

The threshold belongs to the reader and the prompt: pick it on `train` with `tune_threshold`
(highest F1 within a cost budget), never on `test`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from adaptive_rag.contracts import StrategyName
from adaptive_rag.domain import StrategyResult
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.ports import LLM
from adaptive_rag.prompts import no_retrieval as prompt
from adaptive_rag.strategies.base import PhaseTimer, Strategy, ask, clean_answer
from adaptive_rag.strategies.self_route import sum_timings

Aggregate = Literal["min", "mean"]
TRIGGERED = "retrieved"
KEPT = "kept the draft"


def confidence(token_logprobs: Sequence[float] | None, aggregate: Aggregate = "min") -> float:
    """The draft's confidence in [0, 1]: the minimum (FLARE) or the mean token probability.

    No tokens (an empty draft) or no log-probabilities at all count as no confidence.
    """
    if not token_logprobs:
        return 0.0
    probabilities = [math.exp(lp) for lp in token_logprobs]
    if aggregate == "min":
        return min(probabilities)
    if aggregate == "mean":
        return sum(probabilities) / len(probabilities)
    raise ValueError(f"unknown aggregate {aggregate!r}; choose min or mean")


def reports_logprobs(llm: LLM) -> bool:
    """True when `llm`'s completions carry token log-probabilities."""
    return bool(getattr(llm, "logprobs", False))


@dataclass
class Uncertainty:
    """Draft with A on `draft_llm` (which must report log-probabilities); B below the threshold."""

    draft_llm: LLM
    single: Strategy
    threshold: float = 0.5
    aggregate: Aggregate = "min"
    name: str = StrategyName.UNCERTAINTY

    def __post_init__(self) -> None:
        if not reports_logprobs(self.draft_llm):
            raise ConfigurationError(
                "the uncertainty strategy's draft LLM reports no token log-probabilities "
                "(load the embedded model with logprobs=True, see adaptive_rag.llm.logprob_llm)"
            )
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigurationError(f"threshold must lie in [0, 1], got {self.threshold}")
        if self.aggregate not in ("min", "mean"):
            raise ConfigurationError(f"unknown aggregate {self.aggregate!r}; choose min or mean")

    def draft(self, question: str) -> tuple[str, float, bool]:
        """A's answer from the draft, its confidence, and whether log-probabilities came with it.

        Greedy on the same prompt, the answer is the no-retrieval strategy's: collecting these
        on train questions beside A's and B's outcomes is all `tune_threshold` needs.
        """
        answer, token_logprobs = self.draft_tokens(question)
        score = confidence(token_logprobs, self.aggregate) if answer else 0.0
        return answer, score, token_logprobs is not None

    def draft_tokens(self, question: str) -> tuple[str, list[float] | None]:
        """A's answer from the draft and its tokens' log-probabilities (None when none came):
        what the threshold is tuned on, for either aggregate."""
        completion = ask(self.draft_llm, prompt.PROMPT, question=question)
        logprobs = completion.token_logprobs
        return clean_answer(completion.text), (list(logprobs) if logprobs is not None else None)

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("generate"):
            answer, score, scored = self.draft(question)
        why = f"{self.aggregate} token probability {score:.3f}"
        if not scored:
            why = "the draft came without log-probabilities"
        drafted = StrategyResult(strategy=StrategyName.NO_RETRIEVAL, answer=answer, steps=0, timings=timer.finish())
        if answer and score >= self.threshold:
            return StrategyResult(
                strategy=self.name, answer=answer, steps=0,
                timings=sum_timings([drafted]),
                trace=[KEPT, f"{why} >= threshold {self.threshold:.3f}"],
            )
        retrieved = self.single.run(question)
        return StrategyResult(
            strategy=self.name, answer=retrieved.answer, steps=retrieved.steps,
            passages=retrieved.passages,
            timings=sum_timings([drafted, retrieved]),
            trace=[TRIGGERED, f"{why} < threshold {self.threshold:.3f}; draft: {answer!r}"],
            answerable=retrieved.answerable, abstain_reason=retrieved.abstain_reason,
        )


# --- choosing the threshold on train ----------------------------------------------------------


@dataclass(frozen=True)
class DraftExample:
    """One train question: the draft's confidence, A's and B's scores and costs on it.

    Scores are whatever is maximised (F1, or 1/0 correctness); costs are what the budget bounds
    (steps by default: A 0, B 1; or seconds).
    """

    confidence: float
    a_score: float
    b_score: float
    a_cost: float = 0.0
    b_cost: float = 1.0


@dataclass(frozen=True)
class ThresholdChoice:
    threshold: float
    score: float  # mean score when routed with `threshold`
    cost: float  # mean cost per question (A always, plus B where triggered)
    triggered: float  # share of questions that retrieved
    note: str


def evaluate_threshold(threshold: float, examples: Sequence[DraftExample]) -> tuple[float, float, float]:
    """Mean score, mean cost and triggered share when drafts below `threshold` retrieve."""
    if not examples:
        return 0.0, 0.0, 0.0
    score = cost = triggered = 0.0
    for ex in examples:
        if ex.confidence < threshold:
            score += ex.b_score
            cost += ex.a_cost + ex.b_cost
            triggered += 1
        else:
            score += ex.a_score
            cost += ex.a_cost
    n = len(examples)
    return score / n, cost / n, triggered / n


def candidate_thresholds(confidences: Sequence[float]) -> list[float]:
    """0 (never retrieve), the midpoints between neighbouring distinct confidences, and 1."""
    values = sorted({min(max(c, 0.0), 1.0) for c in confidences})
    mids = [(low + high) / 2 for low, high in itertools.pairwise(values)]
    return sorted({0.0, *mids, 1.0})


def tune_threshold(
    examples: Sequence[DraftExample], cost_budget: float | None = None
) -> ThresholdChoice:
    """The threshold with the highest mean score whose mean cost stays within `cost_budget`.

    Ties go to the cheaper threshold. Without a budget the score alone decides. When no
    threshold meets the budget, the cheapest (0: never retrieve) is returned and the note says so.
    """
    scored = []
    for threshold in candidate_thresholds([ex.confidence for ex in examples]):
        score, cost, triggered = evaluate_threshold(threshold, examples)
        scored.append(ThresholdChoice(threshold, score, cost, triggered, note=""))
    within = [c for c in scored if cost_budget is None or c.cost <= cost_budget + 1e-9]
    note = f"tuned on {len(examples)} train questions"
    if cost_budget is not None:
        note += f", cost budget {cost_budget:g}"
    if within:
        best = max(within, key=lambda c: (round(c.score, 9), -c.cost, -c.threshold))
    else:
        best = min(scored, key=lambda c: (c.cost, c.threshold))
        note += "; no threshold met the budget"
    return ThresholdChoice(best.threshold, best.score, best.cost, best.triggered, note)
