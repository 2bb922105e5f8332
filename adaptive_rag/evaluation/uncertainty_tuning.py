"""Choosing the uncertainty strategy's threshold on `train` questions (never `test`).

Per question: the no-retrieval draft with its token log-probabilities (what `Uncertainty` keeps
when confident) and the single step's outcome (what it falls back to). Both are appended to JSONL
files as they finish, so a long run resumes where it stopped. `tune_threshold` then sweeps every
threshold between the observed confidences and keeps the best mean F1 within an optional cost
budget; the cost is seconds (the draft always, the single step where it triggers) or steps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.evaluation.metrics import score
from adaptive_rag.evaluation.runner import Outcome, load_keyed_jsonl
from adaptive_rag.strategies.uncertainty import (
    Aggregate, DraftExample, ThresholdChoice, Uncertainty, candidate_thresholds, confidence,
    evaluate_threshold, tune_threshold,
)

Cost = Literal["seconds", "steps"]
AGGREGATES: tuple[Aggregate, ...] = ("min", "mean")


@dataclass
class Draft:
    """One question's no-retrieval draft, its token log-probabilities (None: none came) and score."""

    question_id: str
    dataset: str
    answer: str
    seconds: float
    em: float
    f1: float
    acc: float
    token_logprobs: list[float] | None = field(default=None)

    @property
    def key(self) -> tuple[str, str]:
        return (self.dataset, self.question_id)


def collect_drafts(
    questions: Iterable[Question], drafter: Uncertainty, path: Path,
    on_progress: Callable[[int], None] | None = None,
) -> dict[tuple[str, str], Draft]:
    """The draft of every question, run for those not yet in `path` (appended as they finish)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    drafts = load_keyed_jsonl(path, Draft)
    with path.open("a", encoding="utf-8") as sink:
        for question in questions:
            if (question.dataset, question.id) not in drafts:
                started = time.perf_counter()
                answer, logprobs = drafter.draft_tokens(question.question)
                draft = Draft(question.id, question.dataset, answer, time.perf_counter() - started,
                              token_logprobs=logprobs, **score(answer, question.answers))
                sink.write(json.dumps(asdict(draft)) + "\n")
                sink.flush()
                drafts[draft.key] = draft
            if on_progress:
                on_progress(1)
    return drafts


def draft_examples(
    drafts: Mapping[tuple[str, str], Draft], single: Mapping[tuple[str, str], Outcome],
    aggregate: Aggregate, cost: Cost = "seconds",
) -> list[DraftExample]:
    """`DraftExample`s for the questions with both a draft and a single-step outcome (F1 scored)."""
    examples = []
    for key, draft in sorted(drafts.items()):
        outcome = single.get(key)
        if outcome is None:
            continue
        conf = confidence(draft.token_logprobs, aggregate) if draft.answer else 0.0
        a_cost, b_cost = (draft.seconds, outcome.seconds) if cost == "seconds" else (0.0, float(outcome.steps))
        examples.append(DraftExample(conf, draft.f1, outcome.f1, a_cost, b_cost))
    return examples


@dataclass(frozen=True)
class Tuned:
    """The chosen threshold of one aggregate, beside the sweep it was chosen from."""

    aggregate: Aggregate
    choice: ThresholdChoice
    sweep: list[dict[str, float]]
    always_a: dict[str, float]
    always_b: dict[str, float]


def tune(
    drafts: Mapping[tuple[str, str], Draft], single: Mapping[tuple[str, str], Outcome],
    aggregates: Sequence[Aggregate] = AGGREGATES, cost: Cost = "seconds", budget: float | None = None,
) -> list[Tuned]:
    """Per aggregate, the best threshold (`tune_threshold`), the whole sweep and both extremes
    (threshold 0 keeps every draft; 1 always retrieves, paying for the draft too)."""
    found = []
    for aggregate in aggregates:
        examples = draft_examples(drafts, single, aggregate, cost)
        if not examples:
            continue
        sweep = []
        for threshold in candidate_thresholds([e.confidence for e in examples]):
            mean_score, mean_cost, triggered = evaluate_threshold(threshold, examples)
            sweep.append({"threshold": threshold, "f1": mean_score, "cost": mean_cost, "triggered": triggered})
        n = len(examples)
        found.append(Tuned(
            aggregate, tune_threshold(examples, budget), sweep,
            always_a={"f1": sum(e.a_score for e in examples) / n, "cost": sum(e.a_cost for e in examples) / n},
            always_b={"f1": sum(e.b_score for e in examples) / n, "cost": sum(e.b_cost for e in examples) / n},
        ))
    return found
