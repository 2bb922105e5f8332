"""Self-Route (after Li et al. 2024): single step first, multi step only when the reader gives up.

The reader of the single step (B) gets the abstaining prompt (`prompts.single_step.ABSTAIN`); when
it declares the passages insufficient (or, with a retrieval threshold set, nothing scored high
enough), the configured multi-step strategy (C) answers instead. The router is the reader itself,
so its cost is B's run on every question plus C's run on the escalated ones: one result whose
steps and timings add both runs, with "escalated" or "not escalated" first in its trace.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from adaptive_rag.contracts import StrategyName
from adaptive_rag.domain import StrategyResult
from adaptive_rag.strategies.base import Strategy
from adaptive_rag.strategies.single_step import SingleStep

ESCALATED = "escalated"
NOT_ESCALATED = "not escalated"


def sum_timings(results: Iterable[StrategyResult]) -> dict[str, float]:
    """Seconds per phase (and in total) of runs made one after the other, added up."""
    timings: dict[str, float] = {}
    for result in results:
        for phase, seconds in result.timings.items():
            timings[phase] = timings.get(phase, 0.0) + seconds
    return timings


@dataclass
class SelfRoute:
    """B with an abstaining reader; C when B abstains."""

    single: SingleStep
    multi: Strategy
    name: str = StrategyName.SELF_ROUTE

    def __post_init__(self) -> None:
        if not self.single.reader_abstains:
            raise ValueError("Self-Route needs a single step whose reader may abstain")

    def run(self, question: str) -> StrategyResult:
        first = self.single.run(question)
        if first.answerable:
            return StrategyResult(
                strategy=self.name, answer=first.answer, steps=first.steps,
                passages=first.passages,
                timings=sum_timings([first]),
                trace=[NOT_ESCALATED, *first.trace],
            )
        second = self.multi.run(question)
        return StrategyResult(
            strategy=self.name, answer=second.answer, steps=first.steps + second.steps,
            passages=second.passages,
            timings=sum_timings([first, second]),
            trace=[ESCALATED, f"{first.strategy}: {first.abstain_reason}",
                   *(f"{second.strategy}: {line}" for line in second.trace)],
            answerable=second.answerable, abstain_reason=second.abstain_reason,
        )
