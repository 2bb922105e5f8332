"""Does the shipped classifier route as accurately as the dataset-identity rule once it knows, as
the rule does, where a question comes from? Each benchmark dataset treated as a tenant with its
own prior shift (`adaptive_rag.routing.tenant_priors`, fitted as the product fits a tenant's:
`adaptive_rag.training.tenant_adaptation`), replayed over recorded outcomes: no reader call.

    python -m lab.experiments.source_priors --data-dir ../shared/data --eval reports/eval-qwen-1.5b-t400

- Labels: a question's tier label is the cheapest tier answering it correctly (EM or Acc), else its
  dataset's tier (the rule's): `train` labels from the router's committed label file
  (`models/router/labels.jsonl`, the questions the reader ran on), `test` labels from the
  evaluation's recorded outcomes (`results.jsonl.gz`).
- Fit, on `train` only: per dataset, the offsets of `fit_offsets` on the router's probabilities of
  that dataset's labels; kept, as in the product, only when their cross-validated accuracy
  (`cross_validated_accuracy`, hash folds) beats the router's own accuracy on those labels.
- `test`, read once: label accuracy (pooled over questions) of the rule, the router and the router
  with the kept priors, with bootstrap intervals and the paired difference to the rule; and what
  the routes are worth: F1 (each dataset weighs the same) against always B, time against always C.

Writes README.md, summary.json and records.jsonl.gz (per `test` question: label, each row's tier,
F1 and seconds) to `--out`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_rag.contracts import TIER_VALUES
from adaptive_rag.evaluation.bootstrap import bootstrap_mean, difference_interval, mean_interval
from adaptive_rag.evaluation.datasets import dataset_tier, limit_per_dataset, load_questions
from adaptive_rag.evaluation.runner import Outcome, load_outcomes
from adaptive_rag.routing.policy import RoutingPolicy
from adaptive_rag.storage.labels import read_label_file
from adaptive_rag.training.bag_of_words import BagOfWordsRouter, served_thresholds
from adaptive_rag.training.tenant_adaptation import PRIOR_L2, cross_validated_accuracy, fit_offsets, routed_tiers
from lab.harness.records import write_summary_and_records

TIER_STRATEGIES = {"A": "no_retrieval", "B": "single_step", "C": "evidence"}
ROWS = ("always B", "always C", "dataset-identity rule", "router", "router + source priors")


def fit_source_priors(router: BagOfWordsRouter, rows: Sequence[Any], policy: RoutingPolicy,
                      ) -> dict[str, dict[str, Any]]:
    """Per dataset of the `train` label rows: the offsets, the router's accuracy on those labels,
    the offsets' cross-validated accuracy, the rule's, and whether the offsets are kept."""
    by_dataset: dict[str, list[Any]] = {}
    for row in rows:
        by_dataset.setdefault(row.dataset, []).append(row)
    fitted = {}
    for dataset, labelled in sorted(by_dataset.items()):
        questions, labels = [r.question for r in labelled], [r.label for r in labelled]
        probs = router.probabilities(questions)
        offsets = fit_offsets(np.log(np.clip(probs, 1e-12, None)), [TIER_VALUES.index(t) for t in labels], PRIOR_L2)
        plain = routed_tiers(probs, np.zeros(len(TIER_VALUES)), policy)
        router_accuracy = sum(r == t for r, t in zip(plain, labels)) / len(labels)
        cross_validated = cross_validated_accuracy(probs, labels, questions, policy)
        rule = dataset_tier(dataset)
        rule_tier = rule.value if rule is not None else "B"
        fitted[dataset] = {
            "labels": len(labels), "label_tiers": dict(sorted(Counter(labels).items())),
            "offsets": [round(float(o), 4) for o in offsets],
            "router_accuracy": router_accuracy, "cross_validated_accuracy": cross_validated,
            "rule_accuracy": sum(t == rule_tier for t in labels) / len(labels),
            "kept": cross_validated > router_accuracy,
        }
    return fitted


def tier_label(outcomes: Mapping[tuple[str, str, str], Outcome], dataset: str, question_id: str) -> str | None:
    """The cheapest tier answering correctly, else the dataset's tier; None without every outcome."""
    found = [outcomes.get((dataset, question_id, TIER_STRATEGIES[t])) for t in TIER_VALUES]
    if any(o is None for o in found):
        return None
    for tier, outcome in zip(TIER_VALUES, found):
        if outcome.correct:
            return tier
    rule = dataset_tier(dataset)
    return rule.value if rule is not None else "B"


def replay(router: BagOfWordsRouter, priors: Mapping[str, Mapping[str, Any]], questions: Sequence[Any],
           outcomes: Mapping[tuple[str, str, str], Outcome], policy: RoutingPolicy) -> list[dict[str, Any]]:
    """Per `test` question with every tier's outcome: its label and each row's tier, F1, seconds."""
    kept = [q for q in questions if tier_label(outcomes, q.dataset, q.id) is not None]
    probs = router.probabilities([q.question for q in kept])
    records = []
    for question, row in zip(kept, probs):
        prior = priors.get(question.dataset)
        offsets = np.asarray(prior["offsets"]) if prior and prior["kept"] else np.zeros(len(TIER_VALUES))
        rule = dataset_tier(question.dataset)
        tiers = {
            "always B": "B", "always C": "C", "dataset-identity rule": rule.value if rule is not None else "B",
            "router": routed_tiers(row[None, :], np.zeros(len(TIER_VALUES)), policy)[0],
            "router + source priors": routed_tiers(row[None, :], offsets, policy)[0],
        }
        record: dict[str, Any] = {"dataset": question.dataset, "question_id": question.id,
                                  "label": tier_label(outcomes, question.dataset, question.id), "rows": {}}
        for name, tier in tiers.items():
            outcome = outcomes[(question.dataset, question.id, TIER_STRATEGIES[tier])]
            record["rows"][name] = {"tier": tier, "f1": outcome.f1, "seconds": outcome.seconds}
        records.append(record)
    return records


def _keyed(records: Sequence[Mapping[str, Any]], row: str, value: str) -> dict[tuple[str, str], float]:
    if value == "correct":
        return {(r["dataset"], r["question_id"]): float(r["rows"][row]["tier"] == r["label"]) for r in records}
    return {(r["dataset"], r["question_id"]): float(r["rows"][row][value]) for r in records}


def _pooled(values: Mapping[tuple[str, str], float]) -> dict[str, Any]:
    """Pooled over questions (as the evaluation report's label accuracy), with its interval."""
    interval = bootstrap_mean({"all": list(values.values())})
    return interval.as_dict() if interval else {}


def summarise(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rule_correct = _keyed(records, "dataset-identity rule", "correct")
    always_b_f1 = _keyed(records, "always B", "f1")
    always_c_seconds = mean_interval(_keyed(records, "always C", "seconds"))
    found: dict[str, Any] = {}
    for row in ROWS:
        correct, f1, seconds = (_keyed(records, row, v) for v in ("correct", "f1", "seconds"))
        diff_rule = bootstrap_mean({"all": [correct[k] - rule_correct[k] for k in correct]})
        mean_seconds = mean_interval(seconds)
        found[row] = {
            "accuracy": _pooled(correct),
            "accuracy_minus_rule": diff_rule.as_dict() if diff_rule else {},
            "f1": mean_interval(f1).as_dict(),
            "f1_minus_always_b": difference_interval(f1, always_b_f1).as_dict(),
            "seconds": mean_seconds.estimate,
            "time_share_of_always_c": mean_seconds.estimate / always_c_seconds.estimate,
            "routed": dict(sorted(Counter(r["rows"][row]["tier"] for r in records).items())),
        }
    return found


def _pct(cell: Mapping[str, Any]) -> str:
    return f"{100 * cell['estimate']:.1f} [{100 * cell['low']:.1f}, {100 * cell['high']:.1f}]"


def _signed(cell: Mapping[str, Any]) -> str:
    return f"{100 * cell['estimate']:+.1f} [{100 * cell['low']:+.1f}, {100 * cell['high']:+.1f}]"


def answer(rows: Mapping[str, Any], priors: Mapping[str, Any]) -> str:
    """The headline: both classifier rows against the rule, and which sources kept a prior."""
    kept = [d for d, p in priors.items() if p["kept"]]
    router, shifted = rows["router"], rows["router + source priors"]
    verdict = ("at least as accurate as the rule" if shifted["accuracy_minus_rule"]["estimate"] >= 0
               else "still less accurate than the rule")
    return (f"With priors kept for {', '.join(kept) or 'no source'}, the classifier is {verdict}: "
            f"{_pct(shifted['accuracy'])} % against the rule's {_pct(rows['dataset-identity rule']['accuracy'])} % "
            f"({_signed(shifted['accuracy_minus_rule'])} points; the router alone {_signed(router['accuracy_minus_rule'])}), "
            f"at {100 * shifted['time_share_of_always_c']:.0f} % of always C's time and "
            f"{_signed(shifted['f1_minus_always_b'])} F1 over always B.")


def readme(summary: Mapping[str, Any]) -> str:
    rows, priors = summary["test"], summary["train_priors"]
    lines = [
        "# Source priors: the shipped classifier told where a question comes from",
        "",
        "**Question.** The dataset-identity rule knows each question's source; the shipped classifier "
        "sees only its text. Given the source as a tenant, with the prior shift the product fits per "
        "tenant on that tenant's `train` labels, is the classifier at least as accurate as the rule on "
        "the `test` labels? And what do its routes buy?",
        "",
        "**Answer.** " + answer(rows, priors),
        "",
        "**How measured.** `" + summary["command"] + "` (no reader call: the routes are replayed over "
        f"`{summary['eval']}`'s recorded outcomes). Priors fitted per dataset on the router's "
        f"`train` label file ({summary['train_labels']} labels), kept only where their cross-validated "
        "accuracy beats the router's own; `test` read once. Accuracy pooled over questions; F1 with each "
        "dataset weighing the same; 95 % bootstrap intervals (2000 resamples, seed 0).",
        "",
        "## `train`: the priors per dataset",
        "",
        "| dataset | labels (A/B/C) | offsets A, C | router | priors (cross-validated) | rule | kept |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for dataset, p in priors.items():
        tiers = "/".join(str(p["label_tiers"].get(t, 0)) for t in TIER_VALUES)
        lines.append(f"| {dataset} | {tiers} | {p['offsets'][0]:+.2f}, {p['offsets'][2]:+.2f} | "
                     f"{100 * p['router_accuracy']:.0f} % | {100 * p['cross_validated_accuracy']:.0f} % | "
                     f"{100 * p['rule_accuracy']:.0f} % | {'yes' if p['kept'] else 'no'} |")
    lines += ["", "The router's column is its accuracy on labels most of which it was fitted on (optimistic); "
              "the priors' is cross-validated (5 hash folds), so a kept prior clears a high bar.",
              "", f"## `test` ({rows['router']['accuracy']['n']} questions)", "",
              "| row | label accuracy | minus the rule | F1 | F1 minus always B | time vs always C | routed A/B/C |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in rows.items():
        routed = "/".join(str(r["routed"].get(t, 0)) for t in TIER_VALUES)
        lines.append(f"| {name} | {_pct(r['accuracy'])} | {_signed(r['accuracy_minus_rule'])} | "
                     f"{100 * r['f1']['estimate']:.1f} | {_signed(r['f1_minus_always_b'])} | "
                     f"{100 * r['time_share_of_always_c']:.0f} % | {routed} |")
    lines += ["", "**Records.** `records.jsonl.gz`: per `test` question, its label and each row's tier, F1 "
              "and seconds; `summary.json`: the tables above.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--router", type=Path, default=Path("models/router/router.json"))
    parser.add_argument("--labels", type=Path, default=Path("models/router/labels.jsonl"))
    parser.add_argument("--eval", type=Path, default=Path("reports/eval-qwen-1.5b-t400"))
    parser.add_argument("--limit", type=int, default=100, help="test questions per dataset (the evaluation's)")
    parser.add_argument("--out", type=Path, default=Path("reports/source_priors"))
    parser.add_argument("--train-only", action="store_true", help="fit and judge the priors on `train`; do not read `test`")
    args = parser.parse_args(argv)
    router = BagOfWordsRouter.load(args.router)
    policy = RoutingPolicy(served_thresholds())  # as `arag model ship` publishes it
    rows = [r for r in read_label_file(args.labels) if r.split == "train"]
    priors = fit_source_priors(router, rows, policy)
    if args.train_only:
        for dataset, found in priors.items():
            print(dataset, {k: v for k, v in found.items() if k != "label_tiers"}, found["label_tiers"])
        return
    outcomes = load_outcomes(args.eval / "results.jsonl.gz")
    questions = limit_per_dataset(load_questions(args.data_dir, split="test"), args.limit)
    records = replay(router, priors, questions, outcomes, policy)
    summary = {
        "command": "python -m lab.experiments.source_priors " + shlex.join(sys.argv[1:] if argv is None else argv),
        "router": str(args.router), "train_labels": len(rows), "eval": str(args.eval),
        "train_priors": priors, "test": summarise(records),
    }
    write_summary_and_records(args.out, summary, records)
    (args.out / "README.md").write_text(readme(summary), encoding="utf-8")
    print(readme(summary))


if __name__ == "__main__":
    main()
