"""`model_promotions` and the retraining lock on a real PostgreSQL: the JSONB columns, the label
watermark, and the advisory lock that lets one retrain run at a time across processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from adaptive_rag.contracts import CLASSIFIER_MODEL
from adaptive_rag.settings import ClassifierSettings
from adaptive_rag.storage import (
    JobBusyError, LabelStore, PromotionStore, TrainingLabel, job_lock, make_engine, upgrade_database,
)
from adaptive_rag.training import retrain as retraining
from adaptive_rag.training.retrain import RetrainOptions, RetrainOutcome, retrain

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = f"{CLASSIFIER_MODEL}-pg-{uuid.uuid4().hex[:6]}"  # its own rows and lock key


@pytest.fixture(scope="module")
def database(postgres_url: str) -> str:
    upgrade_database(postgres_url)
    return postgres_url


def test_promotion_rows_and_new_labels_on_postgres(database):
    engine = make_engine(database)
    store = PromotionStore(engine)
    before = store.label_watermark()
    labels = LabelStore(engine)
    run = uuid.uuid4().hex[:8]  # ARAG_TEST_POSTGRES_URL may be a database that outlives the test
    for i in range(3):
        labels.add(TrainingLabel(origin="live", dataset="live:pg", question_id=f"pg-{run}-{i}", question=f"q {i}?",
                                 label="B", label_source="feedback", split="train",
                                 correct_metric="em_or_acc", outcomes={}))
    row = store.record(MODEL, "retrain", "refused", label_watermark=before, metric="macro_f1",
                       challenger_score=0.5, champion_score=0.6, validation_counts={"A": 1, "B": 2, "C": 0},
                       details={"challenger": {"per_class": {"A": {"precision": None}}}})
    assert row.validation_counts == {"A": 1, "B": 2, "C": 0}
    assert store.new_train_labels(MODEL)[0] == 3
    with engine.connect() as conn:  # JSONB on PostgreSQL
        kind = conn.execute(text(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_name = 'model_promotions' AND column_name = 'details'")).scalar()
    assert kind == "jsonb"
    assert store.recent(MODEL)[0].details["challenger"]["per_class"]["A"]["precision"] is None


def test_the_advisory_lock_lets_one_retrain_run(tmp_path, database, monkeypatch):
    holding, release = threading.Event(), threading.Event()

    def slow_run(engine, promotions, classifier, options, log) -> RetrainOutcome:
        holding.set()
        assert release.wait(30)
        return RetrainOutcome("refused", "slow run finished")

    monkeypatch.setattr(retraining, "_retrain_locked", slow_run)
    settings = ClassifierSettings(_env_file=None, model_repository=tmp_path / "repo", classifier_model=MODEL)
    results: list[RetrainOutcome] = []
    first = threading.Thread(target=lambda: results.append(retrain(database, settings, RetrainOptions(),
                                                                   log=lambda _: None)))
    first.start()
    try:
        assert holding.wait(30)
        second = retrain(database, settings, log=lambda _: None)
        # Another process (a CronJob pod, a manual run) is refused by the same lock.
        probe = subprocess.run(
            [sys.executable, "-c", (
                "import sys\nfrom pathlib import Path\n"
                "from adaptive_rag.storage import JobBusyError, job_lock, make_engine\n"
                "try:\n"
                f"    with job_lock(make_engine(sys.argv[1]), 'retrain:{MODEL}', Path(sys.argv[2])):\n"
                "        print('acquired')\n"
                "except JobBusyError:\n"
                "    print('busy')\n"), database, str(tmp_path / "unused.lock")],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    finally:
        release.set()
        first.join(30)
    assert second.status == "skipped" and "another retrain is running" in second.reason
    assert probe.stdout.strip() == "busy", probe.stderr[-2000:]
    assert [r.status for r in results] == ["refused"]
    with job_lock(make_engine(database), f"retrain:{MODEL}", tmp_path / "unused.lock"):
        pass  # released
    with job_lock(make_engine(database), f"retrain:{MODEL}", tmp_path / "unused.lock"), \
            pytest.raises(JobBusyError), job_lock(make_engine(database), f"retrain:{MODEL}", tmp_path / "x.lock"):
        pass
