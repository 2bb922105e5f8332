"""Which evidence budget for tier B's reader, chosen on `train` only?

Tier B hands the reader five retrieved passages (each cut to 400 characters); on a CPU reader the
prompt's length is the answer's time. `adaptive_rag.evidence.sentences` keeps only the passages'
best sentences up to a token budget. This experiment draws the trade-off on the `train` split:

1. retrieval only, no LLM: for each budget (and each weight of the passage's own similarity,
   `context`), the evidence the reader would get, its prompt tokens (the reader's tokenizer, Qwen2.5;
   the chars/4 estimate beside them) and whether it still holds the gold answer:
   - support suite (COVID FAQ and the demo help centre, their in-KB single questions): recall of
     the gold answer's words in the evidence, and whether a gold article is still among the
     passages the reader gets something from (hit);
   - benchmark single-hop (SQuAD, NQ, TriviaQA, the tier-B datasets): a gold answer (or alias)
     occurs in the evidence;
   the whole passages (today's prompt) are the reference row;
2. `--llm N`: the reader itself on N `train` questions of each knowledge base and dataset, with the whole
   passages and with each budget of `--check` (one llama-server, prompts interleaved per
   question): F1 and hit rate of the answers, paired differences to whole passages.

    python -m lab.experiments.evidence_budget_curve --out reports/evidence_budget            # ~1 min
    python -m lab.experiments.evidence_budget_curve --out reports/evidence_budget --llm 5 --check 120,160

Writes `curve.json`, `curve_records.jsonl.gz` (per question and budget), `curve.png`, and with
`--llm` `train_llm.json`, `train_llm.jsonl`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lab.harness.stack import unwind_on_stop_signals
from lab.harness.stats import mean_interval, paired_difference_interval

REPO = Path(__file__).resolve().parents[2]
BUDGETS = (30, 45, 60, 80, 100, 120, 160, 200, 300)
CONTEXTS = (0.0, 0.5, 1.0, 2.0)
SUPPORT_KBS = ("covid-faq", "help-centre")
SUPPORT_KINDS = ("paraphrase", "faq", "question")
BENCHMARK = ("squad", "nq", "trivia")
WHOLE = 0  # budget 0: the passages whole, as today
_WORD = re.compile(r"\w+")


@dataclass
class Item:
    """One `train` question with what its retrieval found."""

    suite: str  # support | benchmark
    source: str  # knowledge base or dataset
    id: str
    question: str
    golds: list[str]
    gold_docs: list[str]  # support: the gold articles' ids (any one is a hit)
    passages: list[Any]


def words(text: str) -> list[str]:
    from adaptive_rag.evaluation.metrics import normalize_answer

    return normalize_answer(text).split()


def coverage(item: Item, evidence: str) -> float:
    """Support: the largest share of a gold answer's distinct words found in the evidence;
    benchmark: 1 when a gold answer (normalised) occurs in the evidence on word boundaries."""
    found = f" {' '.join(words(evidence))} "
    if item.suite == "benchmark":
        return float(any(f" {' '.join(words(g))} " in found for g in item.golds if words(g)))
    have = set(found.split())
    best = 0.0
    for gold in item.golds:
        wanted = set(words(gold))
        if wanted:
            best = max(best, len(wanted & have) / len(wanted))
    return best


def support_items(settings: Any, split: str, work: Path) -> list[Item]:
    from adaptive_rag.evaluation.support_kbs import build_knowledge_base_suite
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    items = []
    for name in SUPPORT_KBS:
        suite = build_knowledge_base_suite(name, settings)
        index = TantivyRetriever.build(work / name, suite.passages, title_boost=settings.title_boost)
        for query in suite.select(split):
            if query.kind not in SUPPORT_KINDS or len(query.gold_groups) != 1:
                continue
            found = index.search(query.query, settings.top_k)
            items.append(Item("support", name, query.id, query.query, list(query.gold_answers),
                              list(query.gold_groups[0]), found))
    return items


def benchmark_items(settings: Any, split: str, limit: int) -> list[Item]:
    from adaptive_rag.evaluation.datasets import interleaved, load_questions
    from adaptive_rag.retrieval import open_retriever

    retriever = open_retriever(settings)
    items = []
    for question in interleaved(load_questions(settings.data_dir, BENCHMARK, split))[:limit]:
        found = retriever.search(question.question, settings.top_k)
        items.append(Item("benchmark", question.dataset, question.id, question.question, list(question.answers),
                          [], found))
    return items


def reader_tokenizer() -> Any:
    """The default reader's own tokenizer (vocabulary only, no weights loaded)."""
    from llama_cpp import Llama

    from adaptive_rag.readers import DEFAULT_READER, reader_model
    from adaptive_rag.settings import CACHE_DIR

    model = reader_model(DEFAULT_READER)
    path = CACHE_DIR / "models" / model.file_name
    llama = Llama(str(path), vocab_only=True, verbose=False)
    return lambda text: len(llama.tokenize(text.encode(), add_bos=False, special=False)) if text else 0


def evidence_text(item: Item, budget: int, context: float) -> str:
    from adaptive_rag.evidence.sentences import format_evidence
    from adaptive_rag.prompts import format_passages

    if budget == WHOLE:
        return format_passages(item.passages)
    return format_evidence(item.question, item.passages, budget, context)


def evidence_hit(item: Item, evidence: str) -> float | None:
    """Support: a gold article is among the passages the reader gets text from."""
    if item.suite != "support":
        return None
    from adaptive_rag.evaluation.support import doc_id_of

    numbers = {int(n) for n in re.findall(r"^\[(\d+)\] ", evidence, flags=re.MULTILINE)}
    docs = {doc_id_of(item.passages[n - 1].id, item.passages[n - 1].doc_id) for n in numbers}
    return float(bool(docs & set(item.gold_docs)))


def curve(items: Sequence[Item], count: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from adaptive_rag.evidence.sentences import estimate_tokens

    records = []
    for item in items:
        for context in CONTEXTS:
            for budget in (WHOLE, *BUDGETS):
                if budget == WHOLE and context != CONTEXTS[0]:
                    continue
                text = evidence_text(item, budget, context)
                records.append({"suite": item.suite, "source": item.source, "id": item.id, "budget": budget,
                                "context": None if budget == WHOLE else context, "tokens": count(text),
                                "estimated": estimate_tokens(text), "coverage": coverage(item, text),
                                "hit": evidence_hit(item, text)})
    rows = []
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[(record["suite"], record["budget"], record["context"])].append(record)
    for (suite, budget, context), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2] or -1, kv[0][1])):
        row = {"suite": suite, "budget": budget, "context": context, "n": len(group)}
        for name in ("tokens", "estimated", "coverage", "hit"):
            values = [r[name] for r in group if r[name] is not None]
            if not values:
                continue
            cell = mean_interval(values)
            row[name] = {"mean": sum(values) / len(values), "low": cell.low if cell else None,
                         "high": cell.high if cell else None}
        rows.append(row)
    return rows, records


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, suite, ylabel in ((axes[0], "support", "gold answer words in the evidence"),
                              (axes[1], "benchmark", "gold answer in the evidence")):
        for context in CONTEXTS:
            line = [r for r in rows if r["suite"] == suite and r["context"] == context]
            ax.plot([r["tokens"]["mean"] for r in line], [r["coverage"]["mean"] for r in line], marker="o",
                    label=f"sentences, context {context:g}")
            if context == CONTEXT_LABELLED:
                for r in line:
                    ax.annotate(str(r["budget"]), (r["tokens"]["mean"], r["coverage"]["mean"]), fontsize=7,
                                textcoords="offset points", xytext=(3, -9))
        whole = next(r for r in rows if r["suite"] == suite and r["budget"] == WHOLE)
        ax.scatter([whole["tokens"]["mean"]], [whole["coverage"]["mean"]], color="black", marker="*", s=120,
                   zorder=5, label="whole passages (today)")
        ax.set_title(f"{suite} train (n {whole['n']})")
        ax.set_xlabel("evidence prompt tokens per question (Qwen2.5 tokenizer, mean)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("Tier B evidence: budget (labels, estimated tokens) -> gold-answer coverage, retrieval only")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


CONTEXT_LABELLED = 2.0


# --- the reader's check on train ------------------------------------------------------------------


def llm_check(items: Sequence[Item], budgets: Sequence[int], console: Any) -> list[dict[str, Any]]:
    """Each item read with the whole passages and each budget, at once on one llama-server (a
    slot each; the static prefix cached as in serving); F1 and hit of each answer."""
    from adaptive_rag.contracts import AnswerStyle
    from adaptive_rag.evaluation.metrics import accuracy, f1_score
    from adaptive_rag.evaluation.support import doc_id_of
    from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM
    from adaptive_rag.strategies.base import run_metered
    from adaptive_rag.strategies.single_step import SingleStep, cited
    from infra.local.llama_server import LlamaServerProcess

    class Fixed:
        def __init__(self, passages: list[Any]) -> None:
            self.passages = passages

        def search(self, query: str, k: int) -> list[Any]:
            return list(self.passages[:k])

    def read(item: Item, budget: int, llm: Any) -> dict[str, Any]:
        style = AnswerStyle.SUPPORT if item.suite == "support" else AnswerStyle.SHORT
        strategy = SingleStep(Fixed(item.passages), llm, style=style, evidence_tokens=budget or None)
        started = time.perf_counter()
        result = run_metered(strategy, item.question)
        answer = result.answer
        record = {"suite": item.suite, "source": item.source, "id": item.id, "budget": budget,
                  "seconds": time.perf_counter() - started, "prompt_tokens": result.usage.prompt_tokens,
                  "completion_tokens": result.usage.completion_tokens,
                  "f1": f1_score(answer, item.golds) if answer else 0.0, "answer": answer}
        if item.suite == "support":
            docs = [doc_id_of(item.passages[n - 1].id, item.passages[n - 1].doc_id)
                    for n in cited(answer, item.passages)]
            record["hit"] = float(bool(set(docs) & set(item.gold_docs)))
        else:
            record["hit"] = accuracy(answer, item.golds)
        return record

    records: list[dict[str, Any]] = []
    ways = (WHOLE, *budgets)
    # F1 and hit only (no latency here): the ways of one question are read at once, one slot each.
    with LlamaServerProcess(parallel=len(ways), threads=2) as server, \
            ThreadPoolExecutor(len(ways)) as pool:
        llm = OpenAICompatibleLLM(server.base_url, "default", timeout_s=900.0, prompt_style="chat")
        llm.chat([{"role": "user", "content": "hello"}], 4)
        for number, item in enumerate(items, 1):
            records += list(pool.map(lambda budget, item=item: read(item, budget, llm), ways))
            console.print(f"  {number:3}/{len(items)} {item.source:11} " + "  ".join(
                f"{r['budget']}: f1 {r['f1']:.2f} {r['seconds']:.1f}s {r['prompt_tokens']}t"
                for r in records[-len(ways):]))
        llm.close()
    return records


def summarise_llm(records: Sequence[dict[str, Any]], budgets: Sequence[int]) -> dict[str, Any]:
    from lab.harness.stats import median

    out: dict[str, Any] = {}
    for suite in ("support", "benchmark", "all"):
        mine = [r for r in records if suite in ("all", r["suite"])]
        by = {b: {r["id"]: r for r in mine if r["budget"] == b} for b in (WHOLE, *budgets)}
        ids = sorted(by[WHOLE])
        if not ids:
            continue
        cell: dict[str, Any] = {"n": len(ids)}
        for budget in (WHOLE, *budgets):
            rows = [by[budget][i] for i in ids]
            row: dict[str, Any] = {
                "f1": sum(r["f1"] for r in rows) / len(rows), "hit": sum(r["hit"] for r in rows) / len(rows),
                "p50_s": median([r["seconds"] for r in rows]), "prompt_tokens_p50": median([r["prompt_tokens"] for r in rows])}
            if budget != WHOLE:
                for metric in ("f1", "hit"):
                    diff = paired_difference_interval([by[WHOLE][i][metric] for i in ids], [r[metric] for r in rows])
                    row[f"{metric}_diff"] = asdict(diff) if diff else None
            cell["whole" if budget == WHOLE else str(budget)] = row
        out[suite] = cell
    return out


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from adaptive_rag.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "evidence_budget")
    parser.add_argument("--data-dir", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--index-dir", type=Path, default=REPO / "var" / "index",
                        help="the benchmark corpus's tantivy index (`arag index --benchmark`)")
    parser.add_argument("--llm", type=int, default=0,
                        help="reader check: this many train questions per knowledge base and dataset")
    parser.add_argument("--check", default="120,160", help="budgets the reader check compares to whole passages")
    parser.add_argument("--benchmark-limit", type=int, default=450,
                        help="benchmark train questions (interleaved over the three datasets)")
    args = parser.parse_args(argv)
    unwind_on_stop_signals()  # SIGTERM stops the llama-server started here too
    console = Console()
    settings = Settings(_env_file=None, data_dir=args.data_dir, index_dir=args.index_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="arag-evidence-budget-") as work:
        items = support_items(settings, "train", Path(work)) + benchmark_items(settings, "train", args.benchmark_limit)
    console.print(f"train: {sum(i.suite == 'support' for i in items)} support, "
                  f"{sum(i.suite == 'benchmark' for i in items)} benchmark questions")
    if not args.llm:
        count = reader_tokenizer()
        rows, records = curve(items, count)
        (args.out / "curve.json").write_text(json.dumps({"budgets": BUDGETS, "contexts": CONTEXTS, "rows": rows},
                                                        indent=1))
        with gzip.open(args.out / "curve_records.jsonl.gz", "wt") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
        plot(rows, args.out / "curve.png")
        for row in rows:
            console.print(f"{row['suite']:9} context {row['context']!s:4} budget {row['budget']:4}: tokens "
                          f"{row['tokens']['mean']:6.1f} (est {row['estimated']['mean']:6.1f}) coverage "
                          f"{row['coverage']['mean']:.3f}" + (f" hit {row['hit']['mean']:.3f}" if 'hit' in row else ""))
        return 0
    budgets = [int(b) for b in args.check.split(",")]
    by_source: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        by_source[item.source].append(item)
    picked = [item for source in by_source.values() for item in source[: args.llm]]
    records = llm_check(picked, budgets, console)
    from adaptive_rag.evidence.sentences import CONTEXT_WEIGHT

    summary = {"budgets": budgets, "context": CONTEXT_WEIGHT, "per_suite": args.llm, **summarise_llm(records, budgets)}
    (args.out / "train_llm.json").write_text(json.dumps(summary, indent=1))
    (args.out / "train_llm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    console.print_json(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
