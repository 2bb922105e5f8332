"""Which strategy should tier C run with the default reader? Chosen on `train`, from the router
labels' own outcomes.

`arag label` runs A, B and the configured C on the first `--limit` `train` questions of every set
and keeps every outcome in its cache; run it a second time on the multi-hop sets with the other C
(`--multi-step ircot`, the same cache: A and B are not run again) and each multi-hop question has
B, `evidence` and IRCoT, read by the same reader on the same index. This report compares them:

    ARAG_READER=qwen-1.5b arag label --limit 40 --multi-step evidence --cache var/labels/outcomes.jsonl ...
    ARAG_READER=qwen-1.5b arag label --limit 40 --datasets 2wiki,musique,hotpotqa --multi-step ircot \\
        --cache var/labels/outcomes.jsonl --database-url sqlite:///var/labels-ircot.db ...
    python -m lab.experiments.tier_c_train --outcomes reports/labels-qwen-1.5b/outcomes.jsonl.gz

A variant of a C read from another cache joins as a row of its own (`--variant NAME=FILE`: that
file's `evidence` outcomes, named NAME), e.g. `evidence` reading the chain's best sentences
(`ARAG_EVIDENCE_READ_TOKENS`), labelled into a cache seeded with the first cache's A and B.

Per multi-hop set and over the three (the mean of the per-set figures, stratified bootstrap): F1
with its 95 % interval, each C minus B paired per question, the chosen C minus each other C paired,
seconds per question and each C's time against B's, and the share of questions whose supporting
passages were all read. The choice, on the questions every C ran: the C with the highest mean F1
over the sets (ties: the faster).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from adaptive_rag.evaluation.bootstrap import bootstrap_mean
from adaptive_rag.evaluation.datasets import load_questions
from adaptive_rag.evaluation.runner import Outcome, load_outcomes
from lab.experiments.chain_reader import DATASETS, LABELS, _pct, _signed, summarise, table
from lab.harness.stats import paired_difference_interval

B = "single_step"
NOT_C = ("no_retrieval", B)


def with_variants(outcomes: dict[tuple[str, str, str], Outcome], variants: Mapping[str, Path]
                  ) -> dict[tuple[str, str, str], Outcome]:
    """`outcomes` plus each variant file's `evidence` outcomes, renamed to the variant's name."""
    for name, path in variants.items():
        for (dataset, qid, strategy), outcome in load_outcomes(path).items():
            if strategy == "evidence":
                outcomes[(dataset, qid, name)] = replace(outcome, strategy=name)
    return outcomes


def versus(outcomes: Mapping[tuple[str, str, str], Outcome], first: str, second: str) -> dict[str, Any]:
    """`first` minus `second`, F1 points, paired per question: per set and the mean of the sets."""
    per_set: dict[str, list[float]] = {}
    cells: dict[str, Any] = {}
    for dataset in DATASETS:
        keys = sorted({(d, q) for d, q, s in outcomes if d == dataset and s == first}
                      & {(d, q) for d, q, s in outcomes if d == dataset and s == second})
        if not keys:
            continue
        before = [outcomes[(*k, second)].f1 for k in keys]
        after = [outcomes[(*k, first)].f1 for k in keys]
        per_set[dataset] = [a - b for b, a in zip(before, after)]
        cells[dataset] = {"n": len(keys), "difference": _pct(paired_difference_interval(before, after))}
    cells["sets"] = {"n": sum(len(v) for v in per_set.values()), "difference": _pct(bootstrap_mean(per_set))}
    return cells


def choose(summary: Mapping[str, Any]) -> str | None:
    """The C with the highest mean F1 over the sets, ties to the faster (None: no C ran on every set)."""
    scored = [(-cells["sets"]["f1_mean_of_sets"]["mean"], cells["sets"]["seconds_mean"], name)
              for name, cells in summary.items()
              if name not in NOT_C and all(d in cells for d in DATASETS)]
    return min(scored)[2] if scored else None


def readme(result: Mapping[str, Any]) -> str:
    summary, chosen = result["summary"], result["chosen"]
    against = []
    for other, difference in result["chosen_minus"].items():
        over = difference.get("sets", {})
        per_set = "; ".join(f"{LABELS[d]} {_signed(difference[d]['difference'])}" for d in DATASETS if d in difference)
        against.append(f"minus `{other}`: mean over the three sets {_signed(over.get('difference'))} "
                       f"(n {over.get('n', 0)}; {per_set})")
    lines = [
        "# Tier C with the default reader, chosen on `train`\n",
        f"**Answer (`train`, F1 points).** Chosen: **{chosen or 'none yet (no C ran on every set)'}**"
        + (f"; {chosen}, paired per question, " + "; ".join(against) if against else "") + ".\n",
        "Each C against B on the questions every C ran (the choice is made here; time: each C's "
        "total seconds over B's on the same questions):\n",
        table(result["summary_common"]) + "\n",
        "Each row on all the questions it ran:\n",
        table(summary) + "\n",
        f"Records: `{result['outcomes']}` (the router labels' outcomes: A, B and each C per multi-hop "
        "question)" + "".join(f"; `{name}`: `{path}`" for name, path in result["variants"].items())
        + ". Reader: the project's default, embedded, prompt cache reset before each run.\n",
        "## How it was measured\n\n```bash\n" + "\n".join(result["commands"]) + "\n```\n",
        (__doc__ or "").split("\n\n", 1)[1],
    ]
    return "\n".join(lines)


def report(outcomes_path: Path, out: Path, data_dir: Path, commands: Sequence[str],
           variants: Mapping[str, Path] | None = None) -> dict[str, Any]:
    from adaptive_rag.evaluation.corpus import load_corpus

    variants = dict(variants or {})
    outcomes = {k: o for k, o in with_variants(load_outcomes(outcomes_path), variants).items() if k[0] in DATASETS}
    questions = {(q.dataset, q.id): q for q in load_questions(data_dir, DATASETS, split="train")}
    titles = {p.id: p.title for p in load_corpus(data_dir)}
    summary = {name: cells for name, cells in summarise(outcomes, questions, titles).items() if name != "no_retrieval"}
    # the choice compares the Cs on the questions every one of them ran (a C stopped early ran fewer)
    cs = {s for _, _, s in outcomes} - set(NOT_C)
    both = {(d, q) for d, q, _ in outcomes if all((d, q, c) in outcomes for c in cs)}
    common = {name: cells for name, cells in summarise({k: o for k, o in outcomes.items() if k[:2] in both},
                                                       questions, titles).items() if name != "no_retrieval"}
    chosen = choose(common)
    others = [name for name in summary if name not in NOT_C and name != chosen]
    result = {"outcomes": str(outcomes_path), "variants": {n: str(p) for n, p in variants.items()},
              "commands": list(commands), "summary": summary, "summary_common": common, "chosen": chosen,
              "chosen_minus": {other: versus(outcomes, chosen, other) for other in others} if chosen else {}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(readme(result), encoding="utf-8")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    from adaptive_rag.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outcomes", type=Path, default=Path("reports/labels-qwen-1.5b/outcomes.jsonl.gz"))
    parser.add_argument("--out", type=Path, default=Path("reports/tier_c_choice"))
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FILE",
                        help="another cache's `evidence` outcomes as the row NAME (repeatable)")
    parser.add_argument("--command", action="append", default=[],
                        help="a command that produced the outcomes (repeatable; shown in the README)")
    args = parser.parse_args(argv)
    data_dir = args.data_dir or Settings().data_dir
    variants = {}
    for given in args.variant:
        name, _, path = given.partition("=")
        if not name or not path:
            parser.error(f"--variant wants NAME=FILE, got {given!r}")
        variants[name] = Path(path)
    result = report(args.outcomes, args.out, data_dir, args.command, variants)
    print(table(result["summary"]))
    for other, difference in result["chosen_minus"].items():
        print(f"{result['chosen']} minus {other}: {_signed(difference['sets']['difference'])}")
    print(f"chosen: {result['chosen']}")


if __name__ == "__main__":
    main()
