"""Which embedded reader? Every reader x strategy on the same `train` questions, interleaved.

Model selection never looks at `test`, so this runs on a slice of the `train` split: the first
`--per-dataset` questions of each benchmark dataset in the evaluation's stable order. For every
question, every (reader, strategy) pair runs back to back (one process, all readers loaded), so the
machine's load falls on all of them alike and the time ratios compare side by side. Outcomes go to
`<out>/results.jsonl` keyed by `<reader>/<strategy>` (resumable: a rerun continues where it
stopped); `--report-only` rewrites the report from that file.

Reported per reader and strategy, overall and for the single-hop and multi-hop sets: F1 with a
bootstrap 95 % interval, seconds per question and its ratio to the same reader's single step, and
the paired differences the choice rests on (single step minus no retrieval; multi step minus
single step on the multi-hop sets), each with its interval.

    .venv/bin/python -m lab.experiments.readers --per-dataset 8          # reports/readers
    .venv/bin/python -m lab.experiments.readers --report-only
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from adaptive_rag.evaluation.bootstrap import Interval, difference_interval, mean_interval
from adaptive_rag.evaluation.datasets import MULTI_HOP, interleaved, limit_per_dataset, load_questions
from adaptive_rag.evaluation.runner import Outcome, context_reset, load_outcomes, run_evaluation
from adaptive_rag.llm import build_llm
from adaptive_rag.readers import READERS
from adaptive_rag.retrieval import open_retriever
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import build_strategy

STRATEGIES = ("no_retrieval", "single_step", "decompose", "ircot")
# Multi-step variants tried for a reader on `train` (settings overrides; `settings.strategy_knob`).
# The winner's knobs go into the reader's `tuning` (adaptive_rag/readers.py).
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "decompose+own": ("decompose", {"decompose_question_hits_first": True, "max_passages": 9}),
    "ircot+min2+reader": ("ircot", {"ircot_min_steps": 2, "ircot_reader_answers": True,
                                    "max_passages": 8}),
    "ircot+min2+reader+q": ("ircot", {"ircot_min_steps": 2, "ircot_reader_answers": True,
                                      "ircot_query_with_question": True, "max_passages": 8}),
}
MULTI_STEP_ROWS = ("decompose", "ircot", *VARIANTS)


def run(args: argparse.Namespace) -> None:
    base = Settings(index_dir=args.index_dir, data_dir=args.data_dir, llm_threads=args.threads)
    questions = limit_per_dataset(interleaved(load_questions(base.data_dir, args.datasets, split="train")),
                                  args.per_dataset)
    retriever = open_retriever(base)
    runners, resets = {}, []
    for reader in args.readers:
        settings = base.model_copy(update={"reader": reader})
        llm = build_llm(settings)
        resets.append(context_reset(llm))
        for row in args.strategies:
            strategy, overrides = VARIANTS.get(row, (row, {}))
            runners[f"{reader}/{row}"] = build_strategy(
                strategy, retriever, llm, settings.model_copy(update=overrides)
            )
    from rich.progress import Progress

    with Progress() as progress:
        task = progress.add_task("readers x strategies", total=len(questions) * len(runners))
        run_evaluation(
            questions, runners, args.out / "results.jsonl",
            lambda n: progress.advance(task, n),
            lambda: forget_all(resets),
        )


def forget_all(resets: list) -> None:
    """Every reader forgets its prompt state (see `run_evaluation`'s `fresh_context`)."""
    for reset in resets:
        if reset:
            reset()


Key = tuple[str, str]  # (dataset, question id)


def _rows(outcomes: dict[tuple[str, str, str], Outcome]) -> dict[str, dict[Key, Outcome]]:
    """Outcomes by row name (`reader/strategy`), then by (dataset, question id)."""
    rows: dict[str, dict[Key, Outcome]] = {}
    for (dataset, qid, name), outcome in outcomes.items():
        rows.setdefault(name, {})[(dataset, qid)] = outcome
    return rows


def _points(interval: Interval) -> str:
    return f"{100 * interval.estimate:.1f} [{100 * interval.low:.1f}, {100 * interval.high:.1f}]"


def _group_of(key: Key) -> str:
    return "multi-hop" if key[0] in MULTI_HOP else "single-hop"


def report(out: Path, command: str) -> dict:
    """Tables per group and the paired differences. Every row is measured on the questions it
    ran; rows of the reader comparison (no retrieval, single step) ran on every question, the
    multi-step rows may cover only the first ones, and their `n` says so. Differences and time
    ratios pair two rows on the questions both ran."""
    rows = _rows(load_outcomes(out / "results.jsonl"))
    readers = [r for r in READERS if any(name.startswith(r + "/") for name in rows)]
    asked = set().union(*(set(found) for found in rows.values())) if rows else set()
    summary: dict = {"command": command, "questions": len(asked), "rows": {}, "claims": []}
    lines = [
        "# Reader selection on the `train` split", "",
        f"Command: `{command}`", "",
        f"- questions: {len(asked)} (`train`, the first of each dataset in the evaluation's stable "
        "order; datasets: " + ", ".join(
            f"{d} {sum(1 for k in asked if k[0] == d)}" for d in sorted({k[0] for k in asked})
        ) + ")",
        f"- machine: {platform.machine()}, Python {platform.python_version()}, 2 cores shared "
        "with other jobs; per question every (reader, strategy) pair ran back to back",
        "- F1 in points with a bootstrap 95 % interval (questions resampled within each dataset, "
        "the mean of dataset means); time is wall clock per question; \"vs B\" is the time "
        "relative to the same reader's single step and \"vs gemma B\" to Gemma's single step, "
        "each on the same questions", "",
    ]

    def ratio(found: dict[Key, Outcome], base: dict[Key, Outcome] | None, keys: list[Key]) -> str:
        shared = [k for k in keys if base and k in base]
        if not shared:
            return "-"
        return f"{statistics.fmean(found[k].seconds for k in shared) / statistics.fmean(base[k].seconds for k in shared):.2f}"

    gemma_b = rows.get("gemma-270m/single_step")
    for group in ("all", "single-hop", "multi-hop"):
        lines += [f"## {group}", "",
                  "| reader | strategy | n | F1 | EM | s/q | vs B | vs gemma B | steps |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for reader in readers:
            own_b = rows.get(f"{reader}/single_step")
            for strategy in (*STRATEGIES, *VARIANTS):
                found = rows.get(f"{reader}/{strategy}")
                keys = sorted(k for k in (found or {}) if group == "all" or _group_of(k) == group)
                if not keys:
                    continue
                f1 = mean_interval({k: found[k].f1 for k in keys})
                seconds = statistics.fmean(found[k].seconds for k in keys)
                em = 100 * statistics.fmean(found[k].em for k in keys)
                steps = statistics.fmean(found[k].steps for k in keys)
                vs_b, vs_g = ratio(found, own_b, keys), ratio(found, gemma_b, keys)
                summary["rows"].setdefault(group, {})[f"{reader}/{strategy}"] = {
                    "n": len(keys), "f1": f1.estimate, "f1_interval": [f1.low, f1.high],
                    "em": em / 100, "seconds": seconds, "vs_single_step": vs_b,
                    "vs_gemma_single_step": vs_g, "steps": steps,
                }
                lines.append(f"| {reader} | {strategy} | {len(keys)} | {_points(f1)} | {em:.1f} | "
                             f"{seconds:.2f} | {vs_b} | {vs_g} | {steps:.2f} |")
        lines.append("")
    lines += ["## Differences the choice rests on (F1 points, paired, 95 % interval)", "",
              "| claim | group | questions | difference | interval excludes 0 |",
              "| --- | --- | ---: | ---: | --- |"]
    claims = [(f"{r}/single_step", f"{r}/no_retrieval", "all") for r in readers]
    claims += [(f"{r}/single_step", "gemma-270m/single_step", "all")
               for r in readers if r != "gemma-270m"]
    claims += [("qwen-1.5b/single_step", "qwen-0.5b/single_step", "all")]
    claims += [(f"{r}/{c}", f"{r}/single_step", "multi-hop")
               for r in readers for c in MULTI_STEP_ROWS]
    for better, worse, group in claims:
        a, b = rows.get(better), rows.get(worse)
        if not a or not b:
            continue
        keys = [k for k in a if k in b and (group == "all" or _group_of(k) == group)]
        if not keys:
            continue
        diff = difference_interval({k: a[k].f1 for k in keys}, {k: b[k].f1 for k in keys})
        verdict = "yes (better)" if diff.low > 0 else "yes (worse)" if diff.high < 0 else "no"
        summary["claims"].append({"claim": f"{better} - {worse}", "group": group, **diff.as_dict()})
        lines.append(f"| {better} - {worse} | {group} | {len(keys)} | {100 * diff.estimate:+.1f} | "
                     f"[{100 * diff.low:+.1f}, {100 * diff.high:+.1f}] {verdict} |")
    lines.append("")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(summary, out / "f1_vs_time.png")
    return summary


def _plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"].get("all", {})
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    markers = {"no_retrieval": "o", "single_step": "s", "decompose": "^", "ircot": "D",
               "decompose+own": "v", "ircot+min2+reader": "P", "ircot+min2+reader+q": "*"}
    for reader in READERS:
        for name, row in rows.items():
            if name.split("/")[0] != reader:
                continue
            low, high = row["f1_interval"]
            ax.errorbar(row["seconds"], 100 * row["f1"],
                        yerr=[[100 * (row["f1"] - low)], [100 * (high - row["f1"])]],
                        marker=markers.get(name.split("/")[1], "x"), capsize=3,
                        color={"gemma-270m": "tab:gray", "qwen-0.5b": "tab:blue",
                               "qwen-1.5b": "tab:green"}[reader],
                        label=name)
    ax.set_xlabel("seconds per question (wall clock, 2 shared cores)")
    ax.set_ylabel("F1 (points), 95 % interval")
    ax.set_title(f"Readers x strategies on up to {summary['questions']} train questions")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=lambda s: s.split(","), default=list(READERS))
    parser.add_argument("--strategies", type=lambda s: s.split(","), default=list(STRATEGIES))
    parser.add_argument("--per-dataset", type=int, default=8)
    parser.add_argument("--datasets", type=lambda s: s.split(","), default=None,
                        help="only these datasets (default: all six)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--index-dir", type=Path, default=Path("var/bench-index"))
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("reports/readers"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    command = "python -m lab.experiments.readers " + shlex.join(sys.argv[1:] if argv is None else argv)
    if not args.report_only:
        started = time.perf_counter()
        run(args)
        print(f"ran in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    report(args.out, command)
    print((args.out / "report.md").read_text())


if __name__ == "__main__":
    main()
