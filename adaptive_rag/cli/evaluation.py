"""`arag eval`, `arag retrieval-bench`: strategies and retrieval measured on the benchmark data;
`arag eval --suite support`: the router and abstention measured on the support suite."""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from adaptive_rag.cli.common import (
    DataDir, IndexDir, Retr, console, load_classifier_settings, load_settings, progress_bar,
    resolve_strategy,
)
from adaptive_rag.contracts import Tier

if TYPE_CHECKING:
    from adaptive_rag.routing.local_classifier import LocalOnnxClassifier


BENCHMARK_STRATEGIES = "no_retrieval,single_step,ircot,decompose"
SUPPORT_FIXED_ROWS = "b"


def evaluate(
    out: Annotated[Optional[Path], typer.Option(help="report directory (results.jsonl makes it resumable); default reports/eval, or reports/support for --suite support")] = None,
    suite: Annotated[str, typer.Option(help="benchmark (the six QA sets) | support (the COVID FAQ as a help centre)")] = "benchmark",
    datasets: Annotated[Optional[str], typer.Option(help="comma-separated subset of squad,nq,trivia,musique,hotpotqa,2wiki")] = None,
    limit: Annotated[Optional[int], typer.Option(help="questions per dataset (support: per query kind) of the split")] = None,
    strategies: Annotated[Optional[str], typer.Option(help=f"comma-separated strategies to run (default {BENCHMARK_STRATEGIES}); support: the fixed-tier rows beside the router, as tiers a,b,c (default {SUPPORT_FIXED_ROWS})")] = None,
    data_dir: DataDir = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
    multi_step: Annotated[Optional[str], typer.Option(help="C-tier variant for the oracle row")] = None,
    report_only: Annotated[bool, typer.Option(help="write the report from results.jsonl; run nothing")] = False,
    classifier_version: Annotated[Optional[int], typer.Option(help="model version for the \"adaptive\" row (default: the latest trained one in ARAG_MODEL_REPOSITORY)")] = None,
    split: Annotated[str, typer.Option(help="support only: test (report) | train (tuning)")] = "test",
    abstain_min_score: Annotated[Optional[str], typer.Option(help="single step abstains below this BM25 top score; a number, or \"auto\" (support: best on the train split, the default there unless ARAG_ABSTAIN_MIN_SCORE is set)")] = None,
    reader_abstains: Annotated[Optional[bool], typer.Option("--reader-abstains/--no-reader-abstains", help="let the single-step reader say the passages lack the answer (default: ARAG_READER_ABSTAINS)")] = None,
) -> None:
    """Evaluate strategies on the `test` split; writes report.json, report.md, f1_vs_time.png.

    When every tier's strategy ran, the report adds "oracle", "adaptive, rules only" and, if a
    trained classifier version is exported, "adaptive" (that classifier + its calibrated policy,
    run in-process through ONNX Runtime: the same graph Triton serves).

    `--suite support` runs the support suite instead (`adaptive_rag.evaluation.support`): the
    small-talk detector + rules router and the fixed-tier rows over the FAQ knowledge base;
    writes report.json, report.md and support.png.
    """
    if suite not in ("benchmark", "support"):
        raise typer.BadParameter(f"unknown suite {suite!r}; choose benchmark or support")
    auto_threshold = abstain_min_score is not None and abstain_min_score.strip().lower() == "auto"
    min_score: float | None = None
    if abstain_min_score is not None and not auto_threshold:
        try:
            min_score = float(abstain_min_score)
        except ValueError:
            raise typer.BadParameter(f"--abstain-min-score takes a number or auto, not {abstain_min_score!r}") from None
    if suite == "support":
        _evaluate_support(
            out or Path("reports/support"), limit, strategies or SUPPORT_FIXED_ROWS, data_dir,
            multi_step, report_only, split, min_score, auto_threshold, reader_abstains,
        )
        return
    if split != "test":
        raise typer.BadParameter("--split is for --suite support; benchmark reports use the test split")
    if auto_threshold:
        raise typer.BadParameter("--abstain-min-score auto is for --suite support")
    out = out or Path("reports/eval")
    strategies = strategies or BENCHMARK_STRATEGIES
    from adaptive_rag.evaluation.datasets import limit_per_dataset, load_questions
    from adaptive_rag.evaluation.report import markdown, oracle_outcomes, summarise, write_report
    from adaptive_rag.evaluation.runner import load_outcomes, run_evaluation
    from adaptive_rag.strategies import build_strategy, strategy_for_tier

    settings = load_settings(
        data_dir=data_dir, retriever=retriever, index_dir=index_dir, multi_step=multi_step,
        abstain_min_score=min_score, reader_abstains=reader_abstains,
    )
    chosen = datasets.split(",") if datasets else None
    questions = limit_per_dataset(load_questions(settings.data_dir, chosen, split="test"), limit)
    names = [resolve_strategy(s.strip(), settings) for s in strategies.split(",") if s.strip()]
    # Interleave datasets so a partial run already covers every dataset.
    questions.sort(key=lambda q: (hash_rank(q.id), q.dataset))
    if report_only:
        outcomes = load_outcomes(out / "results.jsonl")
    else:
        from adaptive_rag.llm import build_llm
        from adaptive_rag.retrieval import open_retriever

        retr, llm = open_retriever(settings), build_llm(settings)
        runners = {name: build_strategy(name, retr, llm, settings) for name in names}
        with progress_bar("evaluating", len(questions) * len(runners)) as advance:
            outcomes = run_evaluation(questions, runners, out / "results.jsonl", advance)
    rows = {
        name: [outcomes[(q.dataset, q.id, name)] for q in questions if (q.dataset, q.id, name) in outcomes]
        for name in names
    }
    tiers = [strategy_for_tier(t, settings) for t in Tier]
    if all(t in names for t in tiers):
        from adaptive_rag.evaluation.adaptive import routed_outcomes
        from adaptive_rag.routing.local_classifier import rules_router

        rows["oracle"] = oracle_outcomes(outcomes, questions, tiers)
        rows["adaptive, rules only"], _ = routed_outcomes(
            outcomes, questions, tiers, rules_router, "adaptive, rules only"
        )
        classifier = _trained_classifier(classifier_version)
        if classifier is not None:
            rows["adaptive"], routed = routed_outcomes(outcomes, questions, tiers, classifier)
            console.print(f"adaptive row: classifier version {classifier.version.version}, routed {routed}")
    rows = {row: found for row, found in rows.items() if found}
    table = summarise(rows)
    meta = {
        "command": "arag eval " + shlex.join(a for a in sys.argv[2:] if a != "--report-only"),
        "split": "test",
        "questions": len(questions),
        "retriever": settings.retriever,
        "llm": settings.llm_base_url or str(settings.gguf_path or "gemma-3-270m-q4_k_m.gguf (embedded)"),
        "top_k": settings.top_k, "max_steps": settings.max_steps,
        "max_passages": settings.max_passages,
        "oracle_tiers": tiers,
        "multi_step_row": tiers[2],
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
    }
    for path in write_report(table, out, meta):
        console.print(f"wrote {path}")
    console.print(markdown({row: {"average": c["average"]} for row, c in table.items() if "average" in c}))


def _evaluate_support(
    out: Path, limit: int | None, fixed: str, data_dir: Path | None, multi_step: str | None,
    report_only: bool, split: str, min_score: float | None, auto_threshold: bool,
    reader_abstains: bool | None,
) -> None:
    """`arag eval --suite support`: the router and the fixed-tier rows on the support suite."""
    from adaptive_rag.evaluation.support import FIXED_ROWS, ROUTER_ROW, evaluate_support

    if split not in ("train", "test"):
        raise typer.BadParameter(f"--split is train or test, not {split!r}")
    settings = load_settings(
        data_dir=data_dir, multi_step=multi_step, abstain_min_score=min_score,
        reader_abstains=reader_abstains,
    )
    # The retrieval threshold defaults to the train split's best unless it was set explicitly.
    auto = auto_threshold or (min_score is None and "abstain_min_score" not in settings.model_fields_set)
    rows = [ROUTER_ROW]
    for name in (n.strip().lower() for n in fixed.split(",") if n.strip()):
        row = {"a": "always_a", "b": "always_b", "c": "always_c", "no_retrieval": "always_a",
               "single_step": "always_b", "multi_step": "always_c"}.get(name, name)
        if row not in FIXED_ROWS:
            raise typer.BadParameter(f"support rows are tiers a, b, c; not {name!r}")
        if row not in rows:
            rows.append(row)
    meta = {
        "command": "arag eval " + shlex.join(a for a in sys.argv[2:] if a != "--report-only"),
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
    }
    result = evaluate_support(
        settings, out, rows, split=split, limit=limit, run=not report_only,
        auto_threshold=auto, meta=meta, progress=progress_bar,
    )
    for path in result.paths:
        console.print(f"wrote {path}")
    table = Table(title=f"support suite ({split} split)")
    for column in ("row", "n", "F1 in-KB", "hit@5", "false abstain", "out-of-KB abstain", "tier acc", "s/query"):
        table.add_column(column)
    for row, data in result.report["rows"].items():
        o = data["overall"]
        cells = [o["f1"], o["hit_5"], o["false_abstain"], o["out_of_kb_abstain"], o["tier_accuracy"]]
        table.add_row(row, str(o["n"]), *("-" if c["mean"] is None else f"{100 * c['mean']:.1f}" for c in cells),
                      f"{o['seconds']['mean']:.2f}" if o["seconds"]["mean"] is not None else "-")
    console.print(table)


def _trained_classifier(version: int | None) -> LocalOnnxClassifier | None:
    """The exported classifier for the "adaptive" row, or None when only untrained ones exist."""
    from adaptive_rag.routing.local_classifier import LocalOnnxClassifier
    from adaptive_rag.routing.model_repository import open_version, versions

    settings = load_classifier_settings()
    model_dir = settings.model_repository / settings.classifier_model
    candidates = [version] if version is not None else sorted(versions(model_dir), reverse=True)
    for number in candidates:
        chosen = open_version(settings.model_repository, settings.classifier_model, number)
        if version is not None or not chosen.untrained:
            return LocalOnnxClassifier(chosen)
    console.print(f"no trained classifier under {model_dir}: no \"adaptive\" row")
    return None


def hash_rank(question_id: str) -> int:
    """A stable pseudo-random rank of a question id (the evaluation order)."""
    import hashlib

    return int(hashlib.md5(question_id.encode()).hexdigest()[:8], 16)


def retrieval_bench(
    out: Annotated[Path, typer.Option()] = Path("reports/retrieval"),
    data_dir: DataDir = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
    split: Annotated[str, typer.Option(help="test | train (tune on train, report test)")] = "test",
) -> None:
    """Recall@2/5/10 of gold supporting paragraphs (HotpotQA, 2Wiki, MuSiQue) and query latency."""
    from adaptive_rag.evaluation.datasets import load_questions
    from adaptive_rag.evaluation.retrieval_eval import percentile, query_latencies, recall_at_k
    from adaptive_rag.retrieval import open_retriever

    settings = load_settings(data_dir=data_dir, retriever=retriever, index_dir=index_dir)
    retr = open_retriever(settings)
    questions = load_questions(settings.data_dir, ["hotpotqa", "2wiki", "musique"], split=split)
    with progress_bar("recall@k", len(questions)) as advance:
        recall = recall_at_k(retr, questions, (2, 5, 10), advance)
    all_questions = [q.question for q in load_questions(settings.data_dir)]
    latencies = query_latencies(retr, all_questions[:2000], k=5)
    result = {
        "retriever": settings.retriever,
        "split": split,
        "title_boost": settings.title_boost,
        "recall": recall,
        "latency_ms": {
            "queries": len(latencies),
            "p50": 1000 * percentile(latencies, 50), "p95": 1000 * percentile(latencies, 95),
            "p99": 1000 * percentile(latencies, 99),
        },
        "command": "arag retrieval-bench " + shlex.join(sys.argv[2:]),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "retrieval.json").write_text(json.dumps(result, indent=2))
    table = Table(title=f"recall of gold supporting paragraphs ({settings.retriever})")
    for column in ("dataset", "recall@2", "recall@5", "recall@10"):
        table.add_column(column)
    for dataset, values in recall.items():
        table.add_row(dataset, *(f"{values[k]:.3f}" for k in (2, 5, 10)))
    console.print(table)
    lat = result["latency_ms"]
    console.print(f"query latency over {lat['queries']} queries: p50 {lat['p50']:.2f} ms, p95 {lat['p95']:.2f} ms, p99 {lat['p99']:.2f} ms")
