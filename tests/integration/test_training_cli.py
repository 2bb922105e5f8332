"""`arag classifier train | export | calibrate | route` end to end on a labels database filled here
(labelling itself is covered with fake strategies in tests/unit/test_classifier_labels.py)."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from adaptive_rag.cli.classifier import classifier_app
from adaptive_rag.storage import LabelStore, TrainingLabel, make_engine, upgrade_database


TEXTS = {"A": "hello number {i}", "B": "Who wrote book {i}?",
         "C": "Which is older, film {i} or film {i}b, and who directed both?"}


def _fill(url: str) -> None:
    upgrade_database(url)
    store = LabelStore(make_engine(url))
    texts = TEXTS
    for split, n in (("train", 8), ("test", 2)):
        for label, template in texts.items():
            for i in range(n):
                f1 = {"A": float(label == "A"), "B": float(label in "AB"), "C": 1.0}
                store.add(TrainingLabel(
                    origin="benchmark", dataset="nq" if label != "C" else "hotpotqa",
                    question_id=f"{split}-{label}-{i}", question=template.format(i=i), label=label,
                    label_source="silver", split=split, correct_metric="em_or_acc",
                    outcomes={t: {"f1": f1[t], "steps": {"A": 0, "B": 1, "C": 3}[t]} for t in "ABC"},
                ))


def test_train_export_calibrate_route(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path}/arag.db"
    _fill(url)
    repo = tmp_path / "repo"
    runner = CliRunner()
    result = runner.invoke(classifier_app, [
        "train", "--database-url", url, "--repository", str(repo), "--out", str(tmp_path / "run"),
        "--epochs", "1", "--max-steps-per-epoch", "2", "--max-length", "32", "--val-share", "0.25",
        "--export",
    ])
    assert result.exit_code == 0, result.output
    assert "version 1" in result.output
    card = (tmp_path / "run" / "MODEL_CARD.md").read_text()
    from adaptive_rag.training.splits import partition

    asked = [template.format(i=i) for template in TEXTS.values() for i in range(8)]
    fit, held_out = partition(asked, lambda question: question)
    assert len(fit) + len(held_out) == 24 and held_out, "the fixture must put some in validation"
    assert f"{len(fit)} `train` labels" in card and "6 `test` labels" in card
    assert f"Validation: {len(held_out)} `train` labels held out" in card

    result = runner.invoke(classifier_app, ["export", str(tmp_path / "run"), "--repository", str(repo), "--int8"])
    assert result.exit_code == 0, result.output
    assert (repo / "complexity" / "2" / "model.fp32.onnx").is_file()

    result = runner.invoke(classifier_app, [
        "calibrate", "--database-url", url, "--repository", str(repo), "--step-budget", "2.5",
    ])
    assert result.exit_code == 0, result.output
    thresholds = json.loads((repo / "complexity" / "2" / "thresholds.json").read_text())
    calibrated = re.search(r"calibrated on (\d+) validation questions", thresholds["note"])
    assert calibrated and 0 < int(calibrated.group(1)) < len(fit), thresholds["note"]
    assert thresholds["metrics"]["steps"] <= 2.5

    result = runner.invoke(classifier_app, [
        "route", "What is the difference between X and Y?", "--repository", str(repo),
        "--url", "127.0.0.1:1",
    ])
    assert result.exit_code == 0, result.output
    decision = json.loads(result.output)
    assert decision["fallback"] is True and decision["tier"] == "C"
