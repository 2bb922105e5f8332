"""Training labels from live traffic: results, shadow runs and feedback -> "cheapest tier that worked".

A served request has the answer of the tier the router chose (the primary run) and, for a sampled
share of traffic, the answer of a neighbouring tier (the shadow run). Feedback tells which answers
were right:

- a correction (`correct_answer`) scores every run's answer against it (EM or Acc, as the
  benchmark labels do);
- a thumbs up (rating 1) marks the primary answer right, and a shadow answer that says the same
  thing (same normalised text) right too; a different shadow answer counts as wrong;
- a thumbs down (rating -1) marks the primary answer wrong, and a shadow answer that says the same
  thing wrong too; a different shadow answer stays unknown;
- no verdict (rating 0 or no feedback): nothing is known, no label.

The label is the cheapest tier known to be right. When no tier is known to be right but some are
known to be wrong:
- the most capable tier that failed is below C: the label is the tier above it (the router should
  have escalated, and that tier may work);
- C failed too: nothing more capable exists, so escalation cannot be the lesson. When a cheaper
  tier failed as well, the label is the cheapest one that failed (the same failure for less);
  when only C is known to have failed, nothing is known about a cheaper tier: no label.
  (Labelling such a request C taught the router to send support FAQ questions the reader gets
  wrong at every tier to the most expensive one.)
Without the shadow run every label would only confirm or move away from the router's own choice;
with it, a cheaper tier that also worked becomes visible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from adaptive_rag.contracts import TIERS as CONTRACT_TIERS
from adaptive_rag.contracts import ResultKind
from adaptive_rag.evaluation.metrics import accuracy, exact_match, normalize_answer
from adaptive_rag.training.splits import live_split

TIERS = tuple(t.value for t in CONTRACT_TIERS)


@dataclass(frozen=True)
class TierRun:
    """What one tier answered for a request (None: the run failed)."""

    tier: str
    answer: str | None
    kind: str = ResultKind.PRIMARY  # primary | shadow


@dataclass(frozen=True)
class FeedbackVerdict:
    rating: int  # -1 wrong, 0 no verdict, 1 right (about the primary answer)
    correct_answer: str | None = None


@dataclass(frozen=True)
class LiveLabel:
    tier: str
    source: str  # "feedback": from verdicts on the primary run only; "shadow": a shadow run decided
    correctness: dict[str, bool]  # what was known per tier


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and normalize_answer(a) == normalize_answer(b)


def known_correctness(runs: Sequence[TierRun], feedback: Sequence[FeedbackVerdict]) -> dict[str, bool]:
    """Per tier that ran, whether its answer is known to be right (absent: unknown)."""
    primary = next((r for r in runs if r.kind == ResultKind.PRIMARY), None)
    corrections = [f.correct_answer for f in feedback if f.correct_answer and f.correct_answer.strip()]
    known: dict[str, bool] = {}
    if corrections:
        gold = corrections[-1]
        for run in runs:
            if run.answer is None:
                known[run.tier] = False
            else:
                known[run.tier] = bool(exact_match(run.answer, [gold]) or accuracy(run.answer, [gold]))
        return known
    ratings = [f.rating for f in feedback if f.rating != 0]
    if primary is None or not ratings:
        return known
    primary_right = ratings[-1] > 0  # the latest verdict wins
    known[primary.tier] = primary_right and primary.answer is not None
    for run in runs:
        if run is primary:
            continue
        if primary_right:
            known[run.tier] = _same(run.answer, primary.answer)
        elif _same(run.answer, primary.answer) or run.answer is None:
            known[run.tier] = False
    return known


def live_label(runs: Sequence[TierRun], feedback: Sequence[FeedbackVerdict]) -> LiveLabel | None:
    """The training label a served request gives, or None when nothing is known."""
    known = known_correctness(runs, feedback)
    if not known:
        return None
    kinds: Mapping[str, str] = {r.tier: r.kind for r in runs}
    right = [t for t in TIERS if known.get(t) is True]
    if right:
        tier = right[0]
        return LiveLabel(tier, "shadow" if kinds.get(tier) == ResultKind.SHADOW else "feedback", known)
    failed = [t for t in TIERS if known.get(t) is False]
    if failed[-1] != TIERS[-1]:
        tier = TIERS[TIERS.index(failed[-1]) + 1]
    elif len(failed) > 1:
        tier = failed[0]
    else:
        return None
    shadow_known = any(kinds.get(t) == ResultKind.SHADOW for t in known)
    return LiveLabel(tier, "shadow" if shadow_known else "feedback", known)


# --- from the serving records to `training_labels` -------------------------------------------------

@dataclass
class RelabelStats:
    requests: int = 0  # requests with feedback
    labelled: int = 0  # new labels
    updated: int = 0  # labels whose tier changed with newer feedback
    unchanged: int = 0
    unknown: int = 0  # feedback without a verdict, or a verdict that supports no label
    removed: int = 0  # labels dropped because the request no longer supports one
    resplit: int = 0  # labels moved to their question's split (stored before it was by question)
    labels: dict[str, int] | None = None


def relabel_from_records(engine) -> RelabelStats:
    """Turn every request with feedback into a live training label (idempotent; reruns update).

    Labels are rows of `training_labels` with origin "live", dataset "live:<tenant>", the request
    id as question id, and a 60/40 train/test split by a hash of the *normalised question*
    (`adaptive_rag.training.splits.live_split`), not of the request: the same question asked
    twice always lands in one split, so it never sits in training and in a held-out set at once.
    Promotion's validation labels are carved from `train` by the same normalised question.
    """
    from sqlalchemy import select

    from adaptive_rag.storage.db import session_factory
    from adaptive_rag.storage.models import Feedback, QueryRequest, QueryResult, TrainingLabel

    stats = RelabelStats(labels={t: 0 for t in TIERS})
    sessions = session_factory(engine)
    with sessions() as session:
        request_ids = session.scalars(select(Feedback.request_id).distinct()).all()
        for request_id in request_ids:
            stats.requests += 1
            request = session.get(QueryRequest, request_id)
            results = session.scalars(
                select(QueryResult).where(QueryResult.request_id == request_id)
            ).all()
            feedback = session.scalars(
                select(Feedback).where(Feedback.request_id == request_id)
                .order_by(Feedback.created_at, Feedback.id)
            ).all()
            runs = [TierRun(r.tier, None if r.error else r.answer, r.kind) for r in results]
            verdicts = [FeedbackVerdict(f.rating, f.correct_answer) for f in feedback]
            label = live_label(runs, verdicts) if request is not None else None
            existing = session.scalars(select(TrainingLabel).where(
                TrainingLabel.origin == "live", TrainingLabel.request_id == request_id,
            )).first()
            if label is None:
                stats.unknown += 1
                if existing is not None:  # newer feedback (or the rule) no longer supports it
                    session.delete(existing)
                    stats.removed += 1
                continue
            outcomes = {
                r.tier: {"kind": r.kind, "strategy": r.strategy, "answer": r.answer,
                         "steps": r.steps, "correct": label.correctness.get(r.tier)}
                for r in results
            }
            dataset = f"live:{request.tenant}"
            if existing is None:
                session.add(TrainingLabel(
                    origin="live", dataset=dataset, question_id=request_id, question=request.query,
                    label=label.tier, label_source=label.source, split=live_split(request.query),
                    correct_metric="em_or_acc", outcomes=outcomes, request_id=request_id,
                    labeller={"from": "results + shadow runs + feedback", "feedback": len(verdicts)},
                ))
                stats.labelled += 1
            else:
                split = live_split(existing.question)
                if existing.split != split:
                    existing.split = split
                    stats.resplit += 1
                if (existing.label, existing.label_source) != (label.tier, label.source):
                    existing.label, existing.label_source, existing.outcomes = label.tier, label.source, outcomes
                    stats.updated += 1
                else:
                    stats.unchanged += 1
            stats.labels[label.tier] += 1
        session.commit()
    return stats
