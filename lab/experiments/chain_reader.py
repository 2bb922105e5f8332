"""Tier C's `evidence` strategy with the real reader, on `train`: the reader's ceiling and the
choices (budget, prompt), against single step (B) and IRCoT.

    python -m lab.experiments.chain_reader --per-dataset 20 --out var/chain-reader/train
    python -m lab.experiments.chain_reader --per-dataset 10 --rows ircot --out var/chain-reader/train
    python -m lab.experiments.chain_reader --report-only --out var/chain-reader/train

Rows, every one on the same `train` questions of the multi-hop sets (2Wiki, MuSiQue, HotpotQA),
back to back per question so the machine's load falls on all alike (one process, one reader):

- `gold`: the reader given the question's supporting passages alone (its ceiling: read at once);
- `gold-in-5`: the gathered 5 with every missing supporting passage put in place of the
  lowest-ranked others (the ceiling with the chain among 4-ish distractors);
- `single_step`: B as served; `ircot`: the reader's tuned IRCoT (the tier C it replaces);
- `evidence@k`: the `evidence` strategy at budget k; `evidence@k/b-prompt`: the same passages
  read with single step's prompt (does the chain prompt pay?).

Model selection only: `test` is read by `arag eval` (reports/chain-reader/). Outcomes go to
`<out>/results.jsonl` (resumable: a rerun continues); `--report-only` prints the summary from it.
Gold passages are found by title (the supporting titles); a title with several passages in the
corpus gets the one BM25 ranks highest for the question and the title.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import StrategyName
from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.evaluation.corpus import load_corpus
from adaptive_rag.evaluation.datasets import MULTI_HOP, Question, interleaved, limit_per_dataset, load_questions
from adaptive_rag.evaluation.runner import Outcome, context_reset, load_outcomes, run_evaluation
from adaptive_rag.evidence import make_gatherer
from adaptive_rag.evidence.graphs import EntityGraphs
from adaptive_rag.llm import build_llm
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.prompts import Prompt
from adaptive_rag.prompts import evidence as evidence_prompt
from adaptive_rag.prompts import single_step as single_prompt
from adaptive_rag.retrieval import open_retriever
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import build_strategy
from adaptive_rag.strategies.base import PhaseTimer
from adaptive_rag.strategies.evidence import EvidenceRead
from adaptive_rag.strategies.single_step import read_answer
from lab.harness.stats import mean_interval, paired_difference_interval

DATASETS = ("2wiki", "musique", "hotpotqa")
LABELS = {"2wiki": "2Wiki", "musique": "MuSiQue", "hotpotqa": "HotpotQA"}
GATHER_BUDGET = 5
DEFAULT_ROWS = ("gold", "gold-in-5", "single_step", "evidence@5", "evidence@3", "evidence@5/b-prompt")


class GoldPassages:
    """Each question's supporting passages, found in the corpus by title."""

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
    """Reads passages chosen per question by `choose` (the ceilings): one reader call."""

    name: str
    llm: LLM
    choose: Any  # Callable[[str], list[Passage]]
    template: Prompt = evidence_prompt.PROMPT

    def run(self, question: str) -> StrategyResult:
        timer = PhaseTimer()
        with timer.phase("retrieve"):
            passages = self.choose(question)
        with timer.phase("generate"):
            answer = read_answer(self.llm, question, passages, self.template)
        return StrategyResult(self.name, answer, 1, passages, timer.finish())


def gold_among(gathered: list[Passage], gold: list[Passage], budget: int) -> list[Passage]:
    """`gathered`'s first `budget` with every missing gold passage in place of the lowest-ranked
    non-gold ones (gathered order kept otherwise)."""
    top = list(gathered[:budget])
    gold_ids = {p.id for p in gold}
    missing = [p for p in gold if p.id not in {q.id for q in top}]
    for passage in missing:
        if len(top) < budget:
            top.append(passage)
            continue
        for position in range(len(top) - 1, -1, -1):
            if top[position].id not in gold_ids:
                top[position] = passage
                break
    return top


def build_rows(rows: Sequence[str], settings: Settings, retriever: Retriever, llm: LLM,
               questions: Sequence[Question], gold: GoldPassages, graphs: EntityGraphs) -> dict[str, Any]:
    by_text = {q.question: q for q in questions}
    gatherer_graph = graphs.lookup(retriever).graph
    chain = make_gatherer(settings.evidence_gatherer, gatherer_graph)
    runners: dict[str, Any] = {}
    for row in rows:
        if row == "gold":
            runners[row] = FixedPassages(row, llm, lambda text: gold.of(by_text[text]))
        elif row == "gold-in-5":
            runners[row] = FixedPassages(row, llm, lambda text: gold_among(
                chain.gather(text, retriever, GATHER_BUDGET).passages, gold.of(by_text[text]), GATHER_BUDGET))
        elif row.startswith("evidence@"):
            budget_text, _, variant = row.removeprefix("evidence@").partition("/")
            strategy = EvidenceRead(retriever, llm, settings.evidence_gatherer, int(budget_text), graphs)
            if variant == "b-prompt":
                gatherer = make_gatherer(settings.evidence_gatherer, gatherer_graph)
                runners[row] = FixedPassages(row, llm, lambda text, g=gatherer, k=strategy.budget: g.gather(
                    text, retriever, k).passages, single_prompt.PROMPT)
            else:
                runners[row] = strategy
        else:
            runners[row] = build_strategy(StrategyName(row), retriever, llm, settings)
    return runners


def summary(outcomes: dict[tuple[str, str, str], Outcome]) -> dict[str, Any]:
    """F1 (mean, bootstrap 95 %) and seconds per question per row and dataset, and each row's
    paired difference to single step."""
    rows: dict[str, dict[tuple[str, str], Outcome]] = {}
    for (dataset, qid, name), outcome in outcomes.items():
        rows.setdefault(name, {})[(dataset, qid)] = outcome
    base = rows.get("single_step", {})
    found: dict[str, Any] = {}
    for name, by_key in sorted(rows.items()):
        cells = {}
        for dataset in (*DATASETS, "all"):
            keys = [k for k in by_key if dataset == "all" or k[0] == dataset]
            if not keys:
                continue
            f1 = [by_key[k].f1 for k in keys]
            cell: dict[str, Any] = {"n": len(keys), "f1": _cell(mean_interval(f1)),
                                    "seconds": round(statistics.mean(by_key[k].seconds for k in keys), 2)}
            paired = [k for k in keys if k in base]
            if name != "single_step" and paired:
                cell["minus_b"] = _cell(paired_difference_interval(
                    [base[k].f1 for k in paired], [by_key[k].f1 for k in paired]))
                cell["time_ratio_b"] = round(sum(by_key[k].seconds for k in paired)
                                             / max(1e-9, sum(base[k].seconds for k in paired)), 2)
            cells[dataset] = cell
        found[name] = cells
    return found


def _cell(interval: Any) -> dict[str, float] | None:
    if interval is None:
        return None
    return {"mean": round(100 * interval.estimate, 1), "low": round(100 * interval.low, 1),
            "high": round(100 * interval.high, 1)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-dataset", type=int, default=20)
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS))
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--index-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("var/chain-reader/train"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        overrides = {k: v for k, v in (("data_dir", args.data_dir), ("index_dir", args.index_dir)) if v}
        settings = Settings(**overrides)
        chosen = [d for d in args.datasets.split(",") if d]
        assert set(chosen) <= set(MULTI_HOP), chosen
        questions = interleaved(limit_per_dataset(load_questions(settings.data_dir, chosen, split="train"),
                                                  args.per_dataset))
        retriever, llm = open_retriever(settings), build_llm(settings)
        graphs = EntityGraphs(background=False)
        gold = GoldPassages(load_corpus(settings.data_dir), retriever)
        runners = build_rows([r for r in args.rows.split(",") if r], settings, retriever, llm, questions, gold, graphs)
        from rich.progress import Progress

        with Progress() as progress:
            task = progress.add_task("rows x questions", total=len(questions) * len(runners))
            run_evaluation(questions, runners, args.out / "results.jsonl",
                           lambda n: progress.advance(task, n), context_reset(llm))
    found = summary(load_outcomes(args.out / "results.jsonl"))
    (args.out / "summary.json").write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    for name, cells in found.items():
        for dataset, cell in cells.items():
            print(f"{name:22s} {dataset:9s} n={cell['n']:3d} F1 {cell['f1']} s {cell['seconds']}"
                  + (f" -B {cell['minus_b']} x{cell['time_ratio_b']}" if "minus_b" in cell else ""))


if __name__ == "__main__":
    main()
