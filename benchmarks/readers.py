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

    .venv/bin/python -m benchmarks.readers --per-dataset 8          # reports/readers
    .venv/bin/python -m benchmarks.readers --report-only
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
from adaptive_rag.evaluation.datasets import MULTI_HOP, limit_per_dataset, load_questions
from adaptive_rag.evaluation.runner import Outcome, load_outcomes, run_evaluation
from adaptive_rag.llm import build_llm
from adaptive_rag.llm.readers import READERS
from adaptive_rag.retrieval import open_retriever
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import build_strategy

STRATEGIES = ("no_retrieval", "single_step", "decompose", "ircot")


def _hash_rank(question_id: str) -> int:
    import hashlib

    return int(hashlib.md5(question_id.encode()).hexdigest()[:8], 16)


def run(args: argparse.Namespace) -> None:
    base = Settings(index_dir=args.index_dir, data_dir=args.data_dir, llm_threads=args.threads)
    questions = load_questions(base.data_dir, split="train")
    questions.sort(key=lambda q: (_hash_rank(q.id), q.dataset))
    questions = limit_per_dataset(questions, args.per_dataset)
    retriever = open_retriever(base)
    runners = {}
    for reader in args.readers:
        settings = base.model_copy(update={"reader": reader})
        llm = build_llm(settings)
        for strategy in args.strategies:
            runners[f"{reader}/{strategy}"] = build_strategy(strategy, retriever, llm, settings)
    from rich.progress import Progress

    with Progress() as progress:
        task = progress.add_task("readers x strategies", total=len(questions) * len(runners))
        run_evaluation(
            questions, runners, args.out / "results.jsonl",
            lambda n: progress.advance(task, n),
        )


Key = tuple[str, str]  # (dataset, question id)


def _rows(outcomes: dict[tuple[str, str, str], Outcome]) -> dict[str, dict[Key, Outcome]]:
    """Outcomes by row name (`reader/strategy`), then by (dataset, question id)."""
    rows: dict[str, dict[Key, Outcome]] = {}
    for (dataset, qid, name), outcome in outcomes.items():
        rows.setdefault(name, {})[(dataset, qid)] = outcome
    return rows


def _points(interval: Interval) -> str:
    return f"{100 * interval.estimate:.1f} [{100 * interval.low:.1f}, {100 * interval.high:.1f}]"


def report(out: Path, command: str) -> dict:
    rows = _rows(load_outcomes(out / "results.jsonl"))
    readers = [r for r in READERS if any(name.startswith(r + "/") for name in rows)]
    common = set.intersection(*(set(found) for found in rows.values())) if rows else set()
    groups = {
        "all": sorted(common),
        "single-hop": sorted(k for k in common if k[0] not in MULTI_HOP),
        "multi-hop": sorted(k for k in common if k[0] in MULTI_HOP),
    }
    summary: dict = {"command": command, "questions": len(common), "rows": {}, "claims": []}
    lines = [
        "# Reader selection on the `train` split", "",
        f"Command: `{command}`", "",
        f"- questions: {len(common)} (`train`, the same for every row; datasets: "
        + ", ".join(f"{d} {sum(1 for k in common if k[0] == d)}"
                    for d in sorted({k[0] for k in common})) + ")",
        (f"- machine: {platform.machine()}, Python {platform.python_version()}, "
        "2 cores shared with other jobs; every (reader, strategy) ran back to back per question"),
        ("- F1 in points with a bootstrap 95 % interval (questions resampled); time is wall clock "
        "per question; \"vs B\" is the time relative to the same reader's single step, "
        "\"vs gemma B\" relative to Gemma's single step on the same questions"), "",
    ]
    gemma_b = rows.get("gemma-270m/single_step")
    for group, keys in groups.items():
        if not keys:
            continue
        lines += [f"## {group} ({len(keys)} questions)", "",
                  "| reader | strategy | F1 | EM | s/q | vs B | vs gemma B | steps |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for reader in readers:
            own_b = rows.get(f"{reader}/single_step")
            for strategy in STRATEGIES:
                found = rows.get(f"{reader}/{strategy}")
                if not found:
                    continue
                f1 = mean_interval({k: found[k].f1 for k in keys})
                seconds = statistics.fmean(found[k].seconds for k in keys)
                vs_b = seconds / statistics.fmean(own_b[k].seconds for k in keys) if own_b else None
                vs_g = (seconds / statistics.fmean(gemma_b[k].seconds for k in keys)
                        if gemma_b else None)
                em = 100 * statistics.fmean(found[k].em for k in keys)
                steps = statistics.fmean(found[k].steps for k in keys)
                summary["rows"].setdefault(group, {})[f"{reader}/{strategy}"] = {
                    "f1": f1.estimate, "f1_interval": [f1.low, f1.high], "em": em / 100,
                    "seconds": seconds, "vs_single_step": vs_b, "vs_gemma_single_step": vs_g,
                    "steps": steps,
                }
                lines.append(
                    f"| {reader} | {strategy} | {_points(f1)} | {em:.1f} | {seconds:.2f} | "
                    f"{vs_b:.2f} | {vs_g:.2f} | {steps:.2f} |" if vs_b and vs_g else
                    f"| {reader} | {strategy} | {_points(f1)} | {em:.1f} | {seconds:.2f} | - | - | "
                    f"{steps:.2f} |"
                )
        lines.append("")
    lines += ["## Differences the choice rests on (F1 points, paired, 95 % interval)", "",
              "| reader | claim | questions | difference | interval excludes 0 |",
              "| --- | --- | ---: | ---: | --- |"]
    for reader in readers:
        claims = [("single_step - no_retrieval", "all", "single_step", "no_retrieval")]
        claims += [(f"{c} - single_step", "multi-hop", c, "single_step") for c in ("decompose", "ircot")]
        for label, group, better, worse in claims:
            a, b = rows.get(f"{reader}/{better}"), rows.get(f"{reader}/{worse}")
            keys = groups[group]
            if not a or not b or not keys:
                continue
            diff = difference_interval({k: a[k].f1 for k in keys}, {k: b[k].f1 for k in keys})
            verdict = ("yes (better)" if diff.low > 0 else "yes (worse)" if diff.high < 0
                       else "no")
            summary["claims"].append({"reader": reader, "claim": label, "group": group,
                                      **diff.as_dict()})
            lines.append(f"| {reader} | {label} ({group}) | {len(keys)} | "
                         f"{100 * diff.estimate:+.1f} | [{100 * diff.low:+.1f}, "
                         f"{100 * diff.high:+.1f}] {verdict} |")
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
    markers = {"no_retrieval": "o", "single_step": "s", "decompose": "^", "ircot": "D"}
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
    ax.set_title(f"Readers x strategies on {summary['questions']} train questions")
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
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--index-dir", type=Path, default=Path("var/bench-index"))
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("reports/readers"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.readers " + shlex.join(sys.argv[1:] if argv is None else argv)
    if not args.report_only:
        started = time.perf_counter()
        run(args)
        print(f"ran in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    report(args.out, command)
    print((args.out / "report.md").read_text())


if __name__ == "__main__":
    main()
