"""Paired comparison of two evaluation runs over the same questions (e.g. two retrievers).

    python -m lab.experiments.compare_eval_runs reports/eval-slice-tantivy reports/eval-slice-opensearch \
        --out reports/eval-slice-comparison.md

Per strategy: mean F1 of each run on the questions both answered, the paired F1 difference with
a bootstrap 95 % interval (is it noise?), the share of identical answers and the mean Jaccard
overlap of the passages each run read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from adaptive_rag.evaluation.runner import load_outcomes
from lab.harness.stats import paired_difference_interval


def jaccard(a: list[str], b: list[str]) -> float:
    union = set(a) | set(b)
    return len(set(a) & set(b)) / len(union) if union else 1.0


def compare(run_a: Path, run_b: Path) -> str:
    a, b = load_outcomes(run_a / "results.jsonl"), load_outcomes(run_b / "results.jsonl")
    strategies = sorted({key[2] for key in a} & {key[2] for key in b})
    lines = [
        f"# {run_a.name} vs {run_b.name}", "",
        f"Command: `python -m lab.experiments.compare_eval_runs {' '.join(sys.argv[1:])}`", "",
        f"| strategy | n | F1 {run_a.name} | F1 {run_b.name} | paired diff (b - a) | 95 % CI | same answer | passage Jaccard |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for strategy in strategies:
        keys = sorted(k for k in a if k[2] == strategy and k in b)
        if not keys:
            continue
        diffs = [b[k].f1 - a[k].f1 for k in keys]
        interval = paired_difference_interval([a[k].f1 for k in keys], [b[k].f1 for k in keys])
        span = f"[{100 * interval.low:+.1f}, {100 * interval.high:+.1f}]" if interval else "-"
        lines.append(
            f"| {strategy} | {len(keys)} | {100 * statistics.fmean(a[k].f1 for k in keys):.1f} | "
            f"{100 * statistics.fmean(b[k].f1 for k in keys):.1f} | {100 * statistics.fmean(diffs):+.1f} | "
            f"{span} | "
            f"{100 * statistics.fmean(a[k].answer == b[k].answer for k in keys):.0f} % | "
            f"{statistics.fmean(jaccard(a[k].passage_ids, b[k].passage_ids) for k in keys):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = compare(args.run_a, args.run_b)
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
