"""Champion / challenger job: publish a trained run as a new Triton model version only when it
beats the version being served on held-out labels (logic: `adaptive_rag.training.promotion`).

    .venv/bin/python workers/jobs/promote.py RUN_DIR --repository var/model_repository \
        [--metric macro_f1] [--min-gain 0.0] [--int8]

Held-out labels are the `test` split of `training_labels` (never used for training or early
stopping). Both models are scored the same way: the exported ONNX graph in-process
(`LocalOnnxClassifier`), argmax accuracy, macro-F1 and C recall. Needs the `train` extras.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from adaptive_rag.training.promotion import Verdict, promote, score_version  # noqa: E402,F401


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
