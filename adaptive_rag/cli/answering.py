"""`arag index`, `arag ask`, `arag demo`: build the retrieval index and answer questions in-process."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from adaptive_rag.cli.common import (
    DataDir, IndexDir, Retr, console, load_settings, progress_bar, resolve_strategy,
)
from adaptive_rag.domain import StrategyResult

DEMO_DIR = Path(__file__).resolve().parents[2] / "demo"


def index(
    corpus: Annotated[Optional[Path], typer.Argument(help="JSONL knowledge base (title, text, id)")] = None,
    benchmark: Annotated[bool, typer.Option(help="index the shared benchmark corpus of --data-dir")] = False,
    data_dir: DataDir = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
) -> None:
    """Build the retrieval index from a JSONL corpus or from the benchmark corpus."""
    from adaptive_rag.evaluation.corpus import load_corpus, read_jsonl_corpus
    from adaptive_rag.retrieval import build_index

    settings = load_settings(retriever=retriever, index_dir=index_dir, data_dir=data_dir)
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


def _shown_answer(result: StrategyResult) -> str:
    if not result.answerable:
        return f"(abstained: {result.abstain_reason})"
    return result.answer or "(empty)"


def _print_result(result: StrategyResult, show_passages: bool = True) -> None:
    console.print(f"[bold]answer:[/] {_shown_answer(result)}")
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

    settings = load_settings(retriever=retriever, index_dir=index_dir)
    question = validate_query(question, settings.max_query_chars)
    if strategy == "auto":
        tier = rule_tier(question)
        name = strategy_for_tier(tier, settings)
        console.print(f"routed by rules to tier {tier.value} ({name})")
    else:
        name = resolve_strategy(strategy, settings)
    runner = build_strategy(name, open_retriever(settings), build_llm(settings), settings)
    _print_result(runner.run(question))


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
    from adaptive_rag.knowledge.calibration import calibrate
    from adaptive_rag.strategies import build_strategy, deployment_abstention, strategy_for_tier

    settings = load_settings(index_dir=index_dir)
    passages = list(read_jsonl_corpus(knowledge_base))
    retr = TantivyRetriever.build(index_dir, passages, title_boost=settings.title_boost)
    console.print(f"indexed {retr.count()} help-center passages from {knowledge_base} into {index_dir}")
    abstention = deployment_abstention(settings)
    derived = calibrate(retr, retr.count()) if settings.abstain_min_relevance is None else None
    if derived is not None:  # as a tenant's knowledge base gets it on import
        abstention = replace(abstention, min_relevance=derived.threshold)
        console.print(f"abstains below relevance {derived.threshold:g} ({derived.describe()})")
    with console.status("loading the embedded LLM"):
        llm = build_llm(settings)
    examples = json.loads(questions.read_text(encoding="utf-8"))
    total_start = time.perf_counter()
    for example in examples:
        tier = rule_tier(example["question"])
        name = strategy_for_tier(tier, settings)
        result = build_strategy(name, retr, llm, settings, abstention).run(example["question"])
        console.rule(f"[bold]{example['question']}")
        console.print(
            f"tier {tier.value} (expected {example.get('expected_tier', '?')}) -> {name}, "
            f"{result.steps} step(s), {result.timings['total']:.2f} s"
        )
        console.print(f"[bold]answer:[/] {_shown_answer(result)}   [dim](reference: {example.get('answer', '-')})[/]")
        for passage in result.passages[:3]:
            console.print(f"  source {passage.id} [cyan]{passage.title}[/] ({passage.score:.2f})")
    console.print(f"{len(examples)} questions in {time.perf_counter() - total_start:.1f} s")
