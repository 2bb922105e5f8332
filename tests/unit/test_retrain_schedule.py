"""Scheduled retraining: one run at a time (the lock, across threads and processes), a run with
too few new labels is skipped, every outcome is recorded, and the beat schedule is what the
settings say. The training itself is not run here (tests/integration/test_training_promote.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from adaptive_rag.contracts import CLASSIFIER_MODEL
from adaptive_rag.settings import ClassifierSettings
from adaptive_rag.storage import (
    JobBusyError, LabelStore, PromotionStore, TrainingLabel, job_lock, make_engine, upgrade_database,
)
from adaptive_rag.training import retrain as retraining
from adaptive_rag.training.retrain import RetrainOptions, RetrainOutcome, retrain

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def database(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'records.db'}"
    upgrade_database(url)
    return url


def classifier_settings(tmp_path: Path) -> ClassifierSettings:
    return ClassifierSettings(_env_file=None, model_repository=tmp_path / "repo")


def add_labels(url: str, n: int, start: int = 0, split: str = "train") -> None:
    store = LabelStore(make_engine(url))
    for i in range(start, start + n):
        store.add(TrainingLabel(origin="live", dataset="live:acme", question_id=f"r{i}",
                                question=f"question number {i}?", label="ABC"[i % 3],
                                label_source="feedback", split=split, correct_metric="em_or_acc",
                                outcomes={}))


def test_a_run_with_too_few_new_labels_is_skipped_and_recorded(tmp_path, database):
    add_labels(database, 3)
    add_labels(database, 4, start=100, split="test")  # test labels never count
    outcome = retrain(database, classifier_settings(tmp_path), RetrainOptions(min_new_labels=10),
                      log=lambda _: None)
    assert outcome.status == "skipped" and outcome.new_labels == 3
    assert "3 new `train` labels" in outcome.reason and "fewer than the 10" in outcome.reason
    store = PromotionStore(make_engine(database))
    [row] = store.recent(CLASSIFIER_MODEL)
    assert (row.action, row.verdict, row.new_labels, row.id) == ("retrain", "skipped", 3, outcome.record_id)


def test_new_labels_are_counted_from_the_last_decided_retrain(tmp_path, database):
    store = PromotionStore(make_engine(database))
    add_labels(database, 5)
    assert store.new_train_labels(CLASSIFIER_MODEL) == (5, 5)
    # Skipped and failed runs do not move the watermark (the next run tries again) ...
    store.record(CLASSIFIER_MODEL, "retrain", "failed", label_watermark=5)
    store.record(CLASSIFIER_MODEL, "retrain", "skipped", new_labels=5)
    assert store.new_train_labels(CLASSIFIER_MODEL)[0] == 5
    # ... a run that reached a verdict does.
    store.record(CLASSIFIER_MODEL, "retrain", "refused", label_watermark=5)
    assert store.new_train_labels(CLASSIFIER_MODEL) == (0, 5)
    add_labels(database, 2, start=10)
    assert store.new_train_labels(CLASSIFIER_MODEL) == (2, 7)
    assert store.new_train_labels("another-model")[0] == 7


def test_a_second_concurrent_retrain_is_skipped(tmp_path, database, monkeypatch):
    """Two runs at once (two threads: the CLI and a beat delivery, say): the second records
    `skipped` at once instead of training beside the first."""
    holding, release = threading.Event(), threading.Event()

    def slow_run(engine, promotions, classifier, options, log) -> RetrainOutcome:
        holding.set()
        assert release.wait(30)
        return RetrainOutcome("refused", "slow run finished")

    monkeypatch.setattr(retraining, "_retrain_locked", slow_run)
    settings = classifier_settings(tmp_path)
    results: list[RetrainOutcome] = []
    first = threading.Thread(target=lambda: results.append(retrain(database, settings, log=lambda _: None)))
    first.start()
    try:
        assert holding.wait(30)
        second = retrain(database, settings, log=lambda _: None)
    finally:
        release.set()
        first.join(30)
    assert second.status == "skipped" and "another retrain is running" in second.reason
    assert [r.status for r in results] == ["refused"]
    rows = PromotionStore(make_engine(database)).recent(CLASSIFIER_MODEL)
    assert [(r.verdict, r.id) for r in rows] == [("skipped", second.record_id)]
    # Free again once the first run ended.
    third = retrain(database, settings, log=lambda _: None)
    assert third.status == "refused"


HOLD_LOCK = """
import sys
from pathlib import Path
from adaptive_rag.storage import job_lock, make_engine
with job_lock(make_engine(sys.argv[1]), "retrain:complexity", Path(sys.argv[2])):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_the_lock_holds_across_processes(tmp_path, database):
    lock_file = tmp_path / "repo" / ".complexity.retrain.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, database, str(lock_file)], cwd=REPO_ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        engine = make_engine(database)
        with pytest.raises(JobBusyError), job_lock(engine, "retrain:complexity", lock_file):
            pass
        outcome = retrain(database, classifier_settings(tmp_path), log=lambda _: None)
        assert outcome.status == "skipped"
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(30)
    with job_lock(make_engine(database), "retrain:complexity", lock_file):
        pass  # freed when the holder ended


def test_a_run_without_labels_on_both_sides_fails_and_is_recorded(tmp_path, database):
    outcome = retrain(database, classifier_settings(tmp_path), log=lambda _: None)
    assert outcome.status == "failed" and "both sides of the validation split" in outcome.reason
    assert PromotionStore(make_engine(database)).recent(CLASSIFIER_MODEL)[0].verdict == "failed"


def test_triton_urls_for_promotion_come_from_the_settings(monkeypatch):
    from adaptive_rag.training.retrain import control_urls

    for name in ("TRITON_GRPC_URL", "TRITON_URL", "ARAG_TRITON_CONTROL_URLS"):
        monkeypatch.delenv(name, raising=False)
    assert control_urls(ClassifierSettings(_env_file=None)) == []  # the default URL is not "configured"
    assert control_urls(ClassifierSettings(_env_file=None, triton_grpc_url="triton:8001")) == ["triton:8001"]
    both = ClassifierSettings(_env_file=None, triton_control_urls="a:8001, b:8001")
    assert control_urls(both) == ["a:8001", "b:8001"]
    assert control_urls(both, url="c:8001") == ["c:8001"] and control_urls(both, enabled=False) == []


def test_the_beat_schedule_follows_the_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("ARAG_BROKER_DIR", str(tmp_path / "broker"))
    from workers.retraining import RETRAIN_QUEUE, RETRAIN_TASK, app, beat_schedule, parse_crontab

    entry = beat_schedule(ClassifierSettings(_env_file=None, retrain_schedule="30 2 * * 1-5",
                                             retrain_min_new_labels=200))["retrain-classifier"]
    assert entry["task"] == RETRAIN_TASK and entry["options"]["queue"] == RETRAIN_QUEUE
    assert entry["kwargs"] == {"min_new_labels": 200, "relabel": True}
    schedule = entry["schedule"]
    assert schedule.minute == {30} and schedule.hour == {2} and schedule.day_of_week == {1, 2, 3, 4, 5}
    with pytest.raises(ValueError, match="5 crontab fields"):
        parse_crontab("daily")
    task = app.tasks[RETRAIN_TASK]
    assert task.acks_late is False  # a lost worker does not redeliver into a second run
    assert RETRAIN_QUEUE in {q.name for q in app.conf.task_queues}
