"""Champion / challenger: publish a trained run as a new Triton model version only when it beats
the version being served on held-out labels.

    .venv/bin/python workers/jobs/promote.py RUN_DIR --repository var/model_repository \
        [--metric macro_f1] [--min-gain 0.0] [--int8]

Held-out labels are the `test` split of `training_labels` (never used for training or early
stopping). Both models are scored the same way: the exported ONNX graph in-process
(`LocalOnnxClassifier`), argmax accuracy, macro-F1 and C recall. Needs the `train` extras.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from adaptive_rag.classifier.repository import ModelVersion, open_version, versions  # noqa: E402

LABELS = ("A", "B", "C")


@dataclass
class Verdict:
    promoted: bool
    challenger: dict
    champion: dict | None
    version: int | None
    reason: str


def score_version(version: ModelVersion, texts: list[str], labels: list[str]) -> dict:
    """Accuracy, macro-F1 and per-class recall of an exported version on labelled texts."""
    from adaptive_rag.classifier.adaptive import LocalOnnxClassifier
    from adaptive_rag.classifier.training import classification_metrics

    model = LocalOnnxClassifier(version)
    predicted = []
    for start in range(0, len(texts), 64):
        predicted.extend(model.probabilities(texts[start:start + 64]).argmax(axis=1).tolist())
    return classification_metrics([LABELS.index(label) for label in labels], predicted)


def promote(
    run_dir: Path,
    repository: Path,
    texts: list[str],
    labels: list[str],
    model_name: str = "complexity",
    metric: str = "macro_f1",
    min_gain: float = 0.0,
    int8: bool = False,
) -> Verdict:
    """Export `run_dir` as the next version when it beats the latest version by `min_gain`."""
    from adaptive_rag.classifier.export import export_run

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--repository", type=Path, default=Path("var/model_repository"))
    parser.add_argument("--model", default="complexity")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--metric", default="macro_f1", choices=["macro_f1", "accuracy"])
    parser.add_argument("--min-gain", type=float, default=0.0)
    parser.add_argument("--int8", action="store_true")
    args = parser.parse_args(argv)

    from adaptive_rag.settings import Settings
    from adaptive_rag.storage import LabelStore, make_engine, upgrade_database

    url = args.database_url or Settings().database_url
    upgrade_database(url)
    held_out = LabelStore(make_engine(url)).labels(split="test")
    verdict = promote(args.run_dir, args.repository, [r.question for r in held_out],
                      [r.label for r in held_out], args.model, args.metric, args.min_gain, args.int8)
    print(json.dumps({"promoted": verdict.promoted, "version": verdict.version, "reason": verdict.reason,
                      "challenger": {k: verdict.challenger[k] for k in ("accuracy", "macro_f1")},
                      "champion": verdict.champion and {k: verdict.champion[k] for k in ("accuracy", "macro_f1")}},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
