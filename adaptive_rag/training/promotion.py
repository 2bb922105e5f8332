"""Champion / challenger: publish a trained run as a new model version only when it beats the
version being served on held-out labels.

Both models are scored the same way: the exported ONNX graph in-process (`LocalOnnxClassifier`),
argmax accuracy, macro-F1 and C recall. The new version is copied in under a staging name and
renamed into place, so a Triton polling the repository never sees a half-written version.
Needs the `train` extras (export runs PyTorch).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from adaptive_rag.contracts import CLASSIFIER_MODEL, TIERS
from adaptive_rag.routing.model_repository import ModelVersion, open_version, versions



@dataclass
class Verdict:
    promoted: bool
    challenger: dict
    champion: dict | None
    version: int | None
    reason: str


def score_version(version: ModelVersion, texts: list[str], labels: list[str]) -> dict:
    """Accuracy, macro-F1 and per-class recall of an exported version on labelled texts."""
    from adaptive_rag.routing.local_classifier import LocalOnnxClassifier
    from adaptive_rag.training.training import classification_metrics

    model = LocalOnnxClassifier(version)
    predicted = []
    for start in range(0, len(texts), 64):
        predicted.extend(model.probabilities(texts[start:start + 64]).argmax(axis=1).tolist())
    order = [t.value for t in TIERS]  # the classifier's output order
    return classification_metrics([order.index(label) for label in labels], predicted)


def promote(
    run_dir: Path,
    repository: Path,
    texts: list[str],
    labels: list[str],
    model_name: str = CLASSIFIER_MODEL,
    metric: str = "macro_f1",
    min_gain: float = 0.0,
    int8: bool = False,
) -> Verdict:
    """Export `run_dir` as the next version when it beats the latest version by `min_gain`."""
    from adaptive_rag.training.export import export_run

    if not texts:
        raise ValueError("no held-out labels to compare on")
    with tempfile.TemporaryDirectory() as tmp:
        candidate = export_run(run_dir, Path(tmp), model_name, int8=int8)
        challenger = score_version(open_version(Path(tmp), model_name, candidate.version), texts, labels)
        champion = None
        if versions(Path(repository) / model_name):
            champion = score_version(open_version(repository, model_name), texts, labels)
        if champion is not None and not challenger[metric] > champion[metric] + min_gain:
            return Verdict(False, challenger, champion, None,
                           f"challenger {metric} {challenger[metric]:.4f} does not beat champion "
                           f"{champion[metric]:.4f} + {min_gain:g}")
        model_dir = Path(repository) / model_name
        model_dir.mkdir(parents=True, exist_ok=True)
        number = max(versions(model_dir), default=0) + 1
        target = model_dir / str(number)
        source = Path(tmp) / model_name / str(candidate.version)
        info = json.loads((source / "classifier.json").read_text(encoding="utf-8"))
        info.update({"version": number, "promotion": {"metric": metric, "challenger": challenger[metric],
                                                      "champion": champion[metric] if champion else None,
                                                      "held_out": len(texts)}})
        (source / "classifier.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
        staging = model_dir / f".staging-{number}"
        shutil.copytree(source, staging)
        staging.rename(target)
        config = Path(tmp) / model_name / "config.pbtxt"
        if not (model_dir / "config.pbtxt").exists():
            shutil.copy2(config, model_dir / "config.pbtxt")
    reason = "no champion yet" if champion is None else (
        f"challenger {metric} {challenger[metric]:.4f} beats champion {champion[metric]:.4f}")
    return Verdict(True, challenger, champion, number, reason)
