"""`arag`: index a knowledge base, ask a question, evaluate strategies, measure retrieval."""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)
from rich.table import Table

from adaptive_rag.domain import StrategyResult, Tier
from adaptive_rag.errors import AdaptiveRagError
from adaptive_rag.settings import Settings

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False
)

from adaptive_rag.classifier.cli import classifier_app  # noqa: E402  (light: no torch at import)

app.add_typer(classifier_app, name="classifier", help="label, train, export, calibrate, route")
from adaptive_rag.storage.keys_cli import keys_app  # noqa: E402

app.add_typer(keys_app, name="keys", help="API keys of tenants: create, list, revoke")
# The classifier's everyday jobs also answer at the top level (`arag label`, as the docs name them).
from adaptive_rag.classifier import cli as _classifier_cli  # noqa: E402

for _name in ("label", "train", "calibrate", "relabel", "retrain"):
    app.command(name=_name, help=getattr(_classifier_cli, _name).__doc__)(getattr(_classifier_cli, _name))
console = Console()
err_console = Console(stderr=True)

STRATEGY_ALIASES = {"a": "no_retrieval", "b": "single_step", "c": "multi_step"}


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A rich progress bar; yields `advance(n)`."""
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=False,
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


def _settings(**overrides: object) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def main() -> None:
    """Entry point: library errors become one clear line and exit code 2, never a traceback."""
    from pydantic import ValidationError

    try:
        app(standalone_mode=False)
    except AdaptiveRagError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        err_console.print(f"[bold red]error:[/] invalid configuration: {problems}")
        sys.exit(2)
    except typer.TyperException as exc:  # usage errors (BadParameter ...) carry their exit code
        show = getattr(exc, "show", None)
        if show:
            show()
        sys.exit(getattr(exc, "exit_code", 2))
    except (typer.Exit, typer.Abort) as exc:
        sys.exit(getattr(exc, "exit_code", 1))


Retr = Annotated[Optional[str], typer.Option("--retriever", help="tantivy | opensearch")]
IndexDir = Annotated[Optional[Path], typer.Option("--index-dir", help="tantivy index directory")]


@app.command()
def index(
    corpus: Annotated[Optional[Path], typer.Argument(help="JSONL knowledge base (title, text, id)")] = None,
    benchmark: Annotated[bool, typer.Option(help="index the shared benchmark corpus of --data-dir")] = False,
    data_dir: Annotated[Optional[Path], typer.Option()] = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
) -> None:
    """Build the retrieval index from a JSONL corpus or from the benchmark corpus."""
    from adaptive_rag.evaluation.corpus import load_corpus, read_jsonl_corpus
    from adaptive_rag.retrieval import build_index

    settings = _settings(retriever=retriever, index_dir=index_dir, data_dir=data_dir)
    if benchmark == (corpus is not None):
        raise typer.BadParameter("give either a CORPUS file or --benchmark")
    if corpus is not None and not corpus.is_file():
        raise typer.BadParameter(f"corpus file not found: {corpus}")
    passages = load_corpus(settings.data_dir) if benchmark else list(read_jsonl_corpus(corpus))
    start = time.perf_counter()
    with progress_bar(f"indexing ({settings.retriever})", len(passages)) as advance:
        built = build_index(settings, passages, advance)
    seconds = time.perf_counter() - start
    where = settings.index_dir if settings.retriever == "tantivy" else settings.opensearch_index
    console.print(
        f"indexed {len(passages)} passages into {settings.retriever} ({where}) in {seconds:.1f} s "
        f"({len(passages) / max(seconds, 1e-9):.0f} docs/s); index holds {built.count()}"
    )


def _print_result(result: StrategyResult, show_passages: bool = True) -> None:
    console.print(f"[bold]answer:[/] {result.answer or '(empty)'}")
    console.print(
        f"strategy {result.strategy}, {result.steps} step(s), "
        f"{result.timings.get('total', 0.0):.2f} s "
        f"(retrieve {result.timings.get('retrieve', 0.0):.2f} s, "
        f"generate {result.timings.get('generate', 0.0):.2f} s)"
    )
    for line in result.trace:
        console.print(f"  [dim]trace:[/] {line}")
    if show_passages:
        for number, passage in enumerate(result.passages, start=1):
            console.print(
                f"  [{number}] [cyan]{passage.title}[/] ({passage.id}, {passage.score:.2f}): "
                f"{passage.text[:160]}{'...' if len(passage.text) > 160 else ''}"
            )


def _resolve_strategy(name: str, settings: Settings) -> str:
    from adaptive_rag.strategies import STRATEGY_NAMES

    name = STRATEGY_ALIASES.get(name.lower(), name)
    name = settings.multi_step if name == "multi_step" else name
    if name not in STRATEGY_NAMES:
        raise typer.BadParameter(
            f"unknown strategy {name!r}; choose a, b, c, auto or one of {', '.join(STRATEGY_NAMES)}"
        )
    return name


@app.command()
def ask(
    question: str,
    strategy: Annotated[str, typer.Option("--strategy", "-s", help="a | b | c | auto | no_retrieval | single_step | ircot | decompose")] = "auto",
    retriever: Retr = None,
    index_dir: IndexDir = None,
) -> None:
    """Answer one question and show the passages, steps and time."""
    from adaptive_rag.llm import build_llm
    from adaptive_rag.retrieval import open_retriever
    from adaptive_rag.routing.rules import rule_tier
    from adaptive_rag.strategies import build_strategy, strategy_for_tier
    from adaptive_rag.validation import validate_query

    settings = _settings(retriever=retriever, index_dir=index_dir)
    question = validate_query(question, settings.max_query_chars)
    if strategy == "auto":
        tier = rule_tier(question)
        name = strategy_for_tier(tier, settings)
        console.print(f"routed by rules to tier {tier.value} ({name})")
    else:
        name = _resolve_strategy(strategy, settings)
    runner = build_strategy(name, open_retriever(settings), build_llm(settings), settings)
    _print_result(runner.run(question))


@app.command(name="eval")
def evaluate(
    out: Annotated[Path, typer.Option(help="report directory (results.jsonl makes it resumable)")] = Path("reports/eval"),
    datasets: Annotated[Optional[str], typer.Option(help="comma-separated subset of squad,nq,trivia,musique,hotpotqa,2wiki")] = None,
    limit: Annotated[Optional[int], typer.Option(help="questions per dataset (test split)")] = None,
    strategies: Annotated[str, typer.Option(help="comma-separated strategies to run")] = "no_retrieval,single_step,ircot,decompose",
    data_dir: Annotated[Optional[Path], typer.Option()] = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
    multi_step: Annotated[Optional[str], typer.Option(help="C-tier variant for the oracle row")] = None,
    report_only: Annotated[bool, typer.Option(help="write the report from results.jsonl; run nothing")] = False,
    classifier_version: Annotated[Optional[int], typer.Option(help="model version for the \"adaptive\" row (default: the latest trained one in ARAG_MODEL_REPOSITORY)")] = None,
) -> None:
    """Evaluate strategies on the `test` split; writes report.json, report.md, f1_vs_time.png.

    When every tier's strategy ran, the report adds "oracle", "adaptive, rules only" and, if a
    trained classifier version is exported, "adaptive" (that classifier + its calibrated policy,
    run in-process through ONNX Runtime: the same graph Triton serves).
    """
    from adaptive_rag.evaluation.datasets import limit_per_dataset, load_questions
    from adaptive_rag.evaluation.report import oracle_outcomes, summarise, write_report
    from adaptive_rag.evaluation.runner import load_outcomes, run_evaluation
    from adaptive_rag.llm import build_llm
    from adaptive_rag.retrieval import open_retriever
    from adaptive_rag.strategies import build_strategy, strategy_for_tier

    settings = _settings(
        data_dir=data_dir, retriever=retriever, index_dir=index_dir, multi_step=multi_step
    )
    chosen = datasets.split(",") if datasets else None
    questions = limit_per_dataset(load_questions(settings.data_dir, chosen, split="test"), limit)
    names = [_resolve_strategy(s.strip(), settings) for s in strategies.split(",") if s.strip()]
    # Interleave datasets so a partial run already covers every dataset.
    questions.sort(key=lambda q: (hash_rank(q.id), q.dataset))
    if report_only:
        outcomes = load_outcomes(out / "results.jsonl")
    else:
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
        from adaptive_rag.classifier.adaptive import routed_outcomes, rules_router

        rows["oracle"] = oracle_outcomes(outcomes, questions, tiers)
        rows["adaptive, rules only"], _ = routed_outcomes(
            outcomes, questions, tiers, rules_router, "adaptive, rules only"
        )
        classifier = _trained_classifier(settings, classifier_version)
        if classifier is not None:
            rows["adaptive"], routed = routed_outcomes(outcomes, questions, tiers, classifier)
            console.print(f"adaptive row: classifier version {classifier.version}, routed {routed}")
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
    from adaptive_rag.evaluation.report import markdown

    console.print(markdown({row: {"average": c["average"]} for row, c in table.items() if "average" in c}))


def _trained_classifier(settings: Settings, version: int | None):
    """The exported classifier for the "adaptive" row, or None when only untrained ones exist."""
    from adaptive_rag.classifier.adaptive import LocalOnnxClassifier
    from adaptive_rag.classifier.repository import open_version, versions

    model_dir = settings.model_repository / settings.classifier_model
    candidates = [version] if version is not None else sorted(versions(model_dir), reverse=True)
    for number in candidates:
        chosen = open_version(settings.model_repository, settings.classifier_model, number)
        if version is not None or not chosen.untrained:
            return LocalOnnxClassifier(chosen)
    console.print(f"no trained classifier under {model_dir}: no \"adaptive\" row")
    return None


def hash_rank(question_id: str) -> int:
    import hashlib

    return int(hashlib.md5(question_id.encode()).hexdigest()[:8], 16)


@app.command(name="retrieval-bench")
def retrieval_bench(
    out: Annotated[Path, typer.Option()] = Path("reports/retrieval"),
    data_dir: Annotated[Optional[Path], typer.Option()] = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
    split: Annotated[str, typer.Option(help="test | train (tune on train, report test)")] = "test",
) -> None:
    """Recall@2/5/10 of gold supporting paragraphs (HotpotQA, 2Wiki, MuSiQue) and query latency."""
    from adaptive_rag.evaluation.datasets import load_questions
    from adaptive_rag.evaluation.retrieval_eval import percentile, query_latencies, recall_at_k
    from adaptive_rag.retrieval import open_retriever

    settings = _settings(data_dir=data_dir, retriever=retriever, index_dir=index_dir)
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


DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"


@app.command()
def demo(
    knowledge_base: Annotated[Path, typer.Option(help="JSONL knowledge base")] = DEMO_DIR / "knowledge_base.jsonl",
    questions: Annotated[Path, typer.Option(help="JSON list of example questions")] = DEMO_DIR / "questions.json",
    index_dir: Annotated[Path, typer.Option(help="where the demo index is built")] = Path("var/demo-index"),
) -> None:
    """Index the demo help center (fictional Lumora lighting) and answer examples of every tier.

    Routing uses the rule-based router; each answer shows its tier, strategy, sources and time.
    """
    from adaptive_rag.evaluation.corpus import read_jsonl_corpus
    from adaptive_rag.llm import build_llm
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
    from adaptive_rag.routing.rules import rule_tier
    from adaptive_rag.strategies import build_strategy, strategy_for_tier

    settings = _settings(index_dir=index_dir)
    passages = list(read_jsonl_corpus(knowledge_base))
    retr = TantivyRetriever.build(index_dir, passages, title_boost=settings.title_boost)
    console.print(f"indexed {retr.count()} help-center passages from {knowledge_base} into {index_dir}")
    with console.status("loading the embedded LLM"):
        llm = build_llm(settings)
    examples = json.loads(questions.read_text(encoding="utf-8"))
    total_start = time.perf_counter()
    for example in examples:
        tier = rule_tier(example["question"])
        name = strategy_for_tier(tier, settings)
        result = build_strategy(name, retr, llm, settings).run(example["question"])
        console.rule(f"[bold]{example['question']}")
        console.print(
            f"tier {tier.value} (expected {example.get('expected_tier', '?')}) -> {name}, "
            f"{result.steps} step(s), {result.timings['total']:.2f} s"
        )
        console.print(f"[bold]answer:[/] {result.answer or '(empty)'}   [dim](reference: {example.get('answer', '-')})[/]")
        for passage in result.passages[:3]:
            console.print(f"  source {passage.id} [cyan]{passage.title}[/] ({passage.score:.2f})")
    console.print(f"{len(examples)} questions in {time.perf_counter() - total_start:.1f} s")
