"""Automatic labels for the complexity classifier ("silver + binary", Adaptive-RAG section 3.3).

Every training question is answered by the A, B and C strategies. Its label is the cheapest
strategy whose answer is correct (ties go to the cheaper one, as strategies are tried cheapest
first); when none is correct the dataset's inductive bias decides: single-hop datasets -> B,
multi-hop datasets -> C. The first kind is a *silver* label, the second a *binary* one.

Strategy outcomes go through the evaluation runner (`run_evaluation`), whose JSONL cache keeps
every finished (question, strategy) run, so a crash never redoes finished work; the label rows go
to the database, whose `(origin, dataset, question_id)` key makes a rerun skip labelled questions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from adaptive_rag.contracts import Tier
from adaptive_rag.settings import Settings
from adaptive_rag.evaluation.datasets import Question, limit_per_dataset
from adaptive_rag.evaluation.runner import Outcome, run_evaluation
from adaptive_rag.storage.labels import LabelStore
from adaptive_rag.storage.models import TrainingLabel
from adaptive_rag.strategies.base import Strategy

CorrectMetric = Literal["em", "acc", "em_or_acc"]
LabelMode = Literal["both", "silver", "binary"]
LABEL_MODES: tuple[LabelMode, ...] = ("both", "silver", "binary")
TIER_ORDER = (Tier.A, Tier.B, Tier.C)


def is_correct(outcome: Outcome, metric: CorrectMetric = "em_or_acc") -> bool:
    if metric == "em":
        return outcome.em > 0
    if metric == "acc":
        return outcome.acc > 0
    if metric == "em_or_acc":
        return outcome.em > 0 or outcome.acc > 0
    raise ValueError(f"unknown correctness metric {metric!r}: em | acc | em_or_acc")


def choose_label(
    outcomes: Mapping[Tier, Outcome], multi_hop: bool, metric: CorrectMetric = "em_or_acc"
) -> tuple[Tier, str]:
    """`(label, source)`: the cheapest correct tier ("silver"), else the dataset's bias ("binary")."""
    for tier in TIER_ORDER:
        if is_correct(outcomes[tier], metric):
            return tier, "silver"
    return (Tier.C if multi_hop else Tier.B), "binary"


def training_labels(rows: Sequence[TrainingLabel], mode: LabelMode = "both") -> list[tuple[TrainingLabel, str]]:
    """`(row, label)` pairs for training under one of the paper's label schemes (its ablation).

    - `both` (default, "silver + binary"): every row with its stored label, live labels included;
    - `silver`: only benchmark questions some strategy answered correctly, with that label;
    - `binary`: every benchmark question labelled by its dataset's bias alone (B for single-hop
      sets, C for multi-hop sets), whatever the strategies did.

    The two ablations use benchmark labels only: live labels carry no dataset bias to compare.
    """
    from adaptive_rag.evaluation.datasets import dataset_tier

    if mode == "both":
        return [(row, row.label) for row in rows]
    benchmark = [row for row in rows if row.origin == "benchmark"]
    if mode == "silver":
        return [(row, row.label) for row in benchmark if row.label_source == "silver"]
    if mode == "binary":
        return [(row, tier.value) for row in benchmark if (tier := dataset_tier(row.dataset)) is not None]
    raise ValueError(f"unknown label mode {mode!r}: {' | '.join(LABEL_MODES)}")


def binary_labels(data_dir: Path, known: set[tuple[str, str]], split: str = "train",
                  datasets: Sequence[str] | None = None) -> list[TrainingLabel]:
    """A binary label (the dataset's bias) for every benchmark question of `split` (of `datasets`,
    default all) not in `known` (`(dataset, question_id)`): the paper labels every training
    question, while the reader is run on only some of them."""
    from adaptive_rag.evaluation.datasets import dataset_tier, load_questions

    return [TrainingLabel(origin="benchmark", dataset=q.dataset, question_id=q.id, question=q.question,
                          label=tier.value, label_source="binary", split=split, correct_metric="none",
                          outcomes={})
            for q in load_questions(data_dir, datasets, split=split)
            if (q.dataset, q.id) not in known and (tier := dataset_tier(q.dataset)) is not None]


# The support suites whose `train` questions label the shipped router (Quillbill is held out: never).
SUPPORT_LABEL_KBS = ("covid-faq", "help-centre")


def support_labels(settings: Settings, known: set[tuple[str, str]] = frozenset()) -> list[TrainingLabel]:
    """A label for every `train` question of the support suites in `SUPPORT_LABEL_KBS`: its kind's
    tier in the suite (a question an entry answers, or one to abstain on: B; two joined: C; small
    talk: A), the support sets' bias as the dataset's bias is the benchmark's. Without them the
    router knows help-centre wording only from trivia and multi-hop questions, and sends single
    support questions with "both", "if" or "does" in them to C. The COVID FAQ's off-topic questions
    are benchmark questions, so they are left out."""
    from adaptive_rag.evaluation.support import GOLD_TIER, OUT_OF_KB
    from adaptive_rag.evaluation.support_kbs import build_knowledge_base_suite

    labels = []
    for kb in SUPPORT_LABEL_KBS:
        for query in build_knowledge_base_suite(kb, settings).queries:
            if query.split != "train" or (kb == "covid-faq" and query.kind == OUT_OF_KB) or (kb, query.id) in known:
                continue
            labels.append(TrainingLabel(origin="support", dataset=kb, question_id=query.id, question=query.query,
                                        label=GOLD_TIER[query.kind].value, label_source="binary", split="train",
                                        correct_metric="none", outcomes={}))
    return labels


@dataclass
class LabelRunStats:
    labelled: int = 0
    skipped: int = 0  # already in the table
    labels: dict[str, int] = field(default_factory=lambda: {t.value: 0 for t in Tier})
    sources: dict[str, int] = field(default_factory=lambda: {"silver": 0, "binary": 0})


def label_questions(
    questions: Sequence[Question],
    strategies: Mapping[Tier, Strategy],
    store: LabelStore,
    cache_path: Path,
    metric: CorrectMetric = "em_or_acc",
    labeller: Mapping[str, object] | None = None,
    on_progress: Callable[[int], None] | None = None,
    fresh_context: Callable[[], None] | None = None,
) -> LabelRunStats:
    """Label every question not yet stored (origin "benchmark"); one progress tick per question
    (`fresh_context`: as in `run_evaluation`)."""
    missing = [t for t in TIER_ORDER if t not in strategies]
    if missing:
        raise ValueError(f"a strategy is needed for every tier; missing {[t.value for t in missing]}")
    names = {tier: strategies[tier].name for tier in TIER_ORDER}
    runners = {names[tier]: strategies[tier] for tier in TIER_ORDER}
    done = store.existing_keys("benchmark")
    stats = LabelRunStats()
    meta = {"strategies": {t.value: n for t, n in names.items()}, **(labeller or {})}
    for question in questions:
        if (question.dataset, question.id) in done:
            stats.skipped += 1
        else:
            outcomes = run_evaluation([question], runners, cache_path, fresh_context=fresh_context)
            per_tier = {t: outcomes[(question.dataset, question.id, names[t])] for t in TIER_ORDER}
            tier, source = choose_label(per_tier, question.multi_hop, metric)
            store.add(
                TrainingLabel(
                    origin="benchmark", dataset=question.dataset, question_id=question.id,
                    question=question.question, label=tier.value, label_source=source,
                    split=question.split, correct_metric=metric, labeller=meta,
                    outcomes={
                        t.value: {
                            "strategy": o.strategy, "answer": o.answer, "em": o.em, "f1": o.f1,
                            "acc": o.acc, "correct": is_correct(o, metric), "steps": o.steps,
                            "seconds": o.seconds,
                        }
                        for t, o in per_tier.items()
                    },
                )
            )
            done.add((question.dataset, question.id))
            stats.labelled += 1
            stats.labels[tier.value] += 1
            stats.sources[source] += 1
        if on_progress:
            on_progress(1)
    return stats


__all__ = [
    "LABEL_MODES", "CorrectMetric", "LabelMode", "LabelRunStats", "choose_label", "is_correct",
    "label_questions", "limit_per_dataset", "training_labels",
]
