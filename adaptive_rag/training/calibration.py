"""Calibrating the routing policy's thresholds (`adaptive_rag.routing.policy`) for one exported
classifier version: on the version's validation slice (`validation.jsonl`, the probabilities its
training run wrote) and the per-tier F1 and steps stored with those questions' labels, the
thresholds with the highest mean F1 within a step budget, saved beside the version.

`calibrate_version` is the one way it is done: by `arag classifier calibrate` and by a retraining
run's candidate (`training.retrain`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from adaptive_rag.contracts import TIER_VALUES, Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routing.policy import PolicyThresholds, RoutingPolicy

if TYPE_CHECKING:
    from adaptive_rag.storage import LabelStore

VALIDATION_FILE = "validation.jsonl"


@dataclass(frozen=True)
class CalibrationExample:
    """One validation question: the classifier's probabilities and each tier's measured outcome."""

    probabilities: tuple[float, float, float]  # A, B, C
    f1: Mapping[str, float]  # tier value -> F1 of that tier's strategy on this question
    steps: Mapping[str, float]  # tier value -> retrieval/generation steps it took


def evaluate_thresholds(
    thresholds: PolicyThresholds, examples: Sequence[CalibrationExample]
) -> dict[str, float]:
    """Mean F1 and mean steps when every example is routed with `thresholds`."""
    policy = RoutingPolicy(thresholds)
    if not examples:
        return {"f1": 0.0, "steps": 0.0, "share_c": 0.0}
    f1 = steps = share_c = 0.0
    for example in examples:
        tier, _ = policy.tier(example.probabilities)
        f1 += example.f1[tier.value]
        steps += example.steps[tier.value]
        share_c += tier is Tier.C
    n = len(examples)
    return {"f1": f1 / n, "steps": steps / n, "share_c": share_c / n}


def calibrate_thresholds(
    examples: Sequence[CalibrationExample],
    step_budget: float | None = None,
    c_grid: Iterable[float | None] | None = None,
    a_grid: Iterable[float | None] | None = None,
) -> PolicyThresholds:
    """The thresholds with the highest mean F1 whose mean steps stay within `step_budget`.

    Ties go to fewer steps. With no budget, F1 alone decides. When no setting meets the budget,
    the cheapest one is returned (and its note says so).
    """
    c_values = list(c_grid) if c_grid is not None else [None] + [i / 20 for i in range(1, 20)]
    a_values = list(a_grid) if a_grid is not None else [None] + [i / 20 for i in range(7, 20)]
    scored = []
    for c in c_values:
        for a in a_values:
            thresholds = PolicyThresholds(c_threshold=c, a_threshold=a)
            scored.append((thresholds, evaluate_thresholds(thresholds, examples)))
    within = [s for s in scored if step_budget is None or s[1]["steps"] <= step_budget + 1e-9]
    if within:
        best, metrics = max(within, key=lambda s: (round(s[1]["f1"], 9), -s[1]["steps"]))
        note = f"calibrated on {len(examples)} validation questions"
    else:
        best, metrics = min(scored, key=lambda s: s[1]["steps"])
        note = f"calibrated on {len(examples)} validation questions; no setting met the budget"
    if step_budget is not None:
        note += f", step budget {step_budget:g}"
    return PolicyThresholds(
        c_threshold=best.c_threshold, a_threshold=best.a_threshold, note=note,
        metrics={**metrics, "n": float(len(examples))},
    )


def calibration_examples(version_dir: Path, labels: LabelStore, split: str | None = "train") -> list[CalibrationExample]:
    """The version's validation questions whose labels (of `split`; None: any) store every tier's
    F1 and steps (benchmark labels have them; live labels do not)."""
    val_path = Path(version_dir) / VALIDATION_FILE
    if not val_path.is_file():
        raise ConfigurationError(f"{val_path} missing: the run had no validation slice")
    rows = [json.loads(line) for line in val_path.read_text(encoding="utf-8").splitlines() if line]
    stored = {(r.dataset, r.question_id): r for r in labels.labels(split=split)}
    examples = []
    for row in rows:
        label = stored.get((row["dataset"], row["question_id"]))
        outcomes = label.outcomes if label is not None else {}
        if not all(isinstance(outcomes.get(t), dict) and "f1" in outcomes[t] and "steps" in outcomes[t]
                   for t in TIER_VALUES):
            continue
        examples.append(CalibrationExample(
            probabilities=tuple(row["probabilities"]),
            f1={t: float(outcomes[t]["f1"]) for t in TIER_VALUES},
            steps={t: float(outcomes[t]["steps"]) for t in TIER_VALUES},
        ))
    return examples


@dataclass(frozen=True)
class Calibration:
    """What `calibrate_version` chose, on which examples, and where it wrote it."""

    examples: list[CalibrationExample]
    chosen: PolicyThresholds
    path: Path


def calibrate_version(version_dir: Path, labels: LabelStore, step_budget: float | None = None,
                      split: str | None = "train") -> Calibration:
    """Choose the version's thresholds on its validation slice and write `thresholds.json` beside
    it; `ConfigurationError` when there is nothing to calibrate on (the version then keeps the
    thresholds it has)."""
    examples = calibration_examples(version_dir, labels, split)
    if not examples:
        raise ConfigurationError("no validation question has stored outcomes to calibrate on")
    chosen = calibrate_thresholds(examples, step_budget)
    return Calibration(examples, chosen, chosen.save(Path(version_dir)))
