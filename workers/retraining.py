"""Scheduled retraining: Celery beat sends one `adaptive_rag.retrain` task on a crontab, a worker
on the `retrain` queue runs the same code as `arag retrain --relabel --if-new-labels N`.

    celery -A workers.retraining beat --schedule /tmp/celerybeat-schedule     # one, ever
    celery -A workers.retraining worker -Q retrain -n retrain@%h --concurrency 1   # train image

- Schedule: `ARAG_RETRAIN_SCHEDULE` (crontab, UTC; default 03:00 daily). Threshold:
  `ARAG_RETRAIN_MIN_NEW_LABELS` `train` labels since the last retrain that reached a verdict.
- Never two at once: the run holds a lock (PostgreSQL advisory lock in production), so a second
  delivery, a manual `arag retrain` or a second beat records `skipped` and returns.
- The message is acknowledged on receipt (not after the run like the tier tasks): a worker lost
  mid-training is not redelivered into a second run; the next schedule tries again. A message
  nobody took within `EXPIRES_S` is dropped rather than piling up behind a stopped worker.
- Outcome: one `model_promotions` row per run (promoted, refused, failed or skipped) and the
  task's result (the same summary `arag retrain` prints).

Only this module's processes add the `retrain` queue and the beat schedule to the shared app; the
tier workers and the front door never import it.
"""

from __future__ import annotations

import structlog
from celery.schedules import crontab
from kombu import Queue

from adaptive_rag.settings import ClassifierSettings, Settings
from workers.celery_app import app

RETRAIN_QUEUE = "retrain"
RETRAIN_TASK = "adaptive_rag.retrain"
EXPIRES_S = 12 * 3600
log = structlog.get_logger("workers.retraining")


def parse_crontab(text: str) -> crontab:
    """`minute hour day-of-month month day-of-week` (five fields, as in crontab(5))."""
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(f"ARAG_RETRAIN_SCHEDULE needs 5 crontab fields, got {text!r}")
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    return crontab(minute=minute, hour=hour, day_of_month=day_of_month,
                   month_of_year=month_of_year, day_of_week=day_of_week)


def beat_schedule(settings: ClassifierSettings) -> dict:
    """The beat entry: the retrain task on its queue, on the configured crontab."""
    return {
        "retrain-classifier": {
            "task": RETRAIN_TASK,
            "schedule": parse_crontab(settings.retrain_schedule),
            "kwargs": {"min_new_labels": settings.retrain_min_new_labels, "relabel": True},
            "options": {"queue": RETRAIN_QUEUE, "expires": EXPIRES_S},
        }
    }


def _configure(settings: ClassifierSettings) -> None:
    queues = list(app.conf.task_queues or [])
    if RETRAIN_QUEUE not in {q.name for q in queues}:
        app.conf.task_queues = [*queues, Queue(RETRAIN_QUEUE, routing_key=RETRAIN_QUEUE)]
    app.conf.task_routes = {**(app.conf.task_routes or {}), RETRAIN_TASK: {"queue": RETRAIN_QUEUE}}
    app.conf.beat_schedule = beat_schedule(settings)
    app.conf.timezone = "UTC"


_configure(ClassifierSettings())


@app.task(name=RETRAIN_TASK, acks_late=False, ignore_result=False)
def retrain_task(min_new_labels: int | None = None, relabel: bool = True, epochs: int = 3) -> dict:
    """One retraining run (lock, threshold, train, promote, record); returns its summary."""
    from adaptive_rag.training.retrain import RetrainOptions, control_urls, retrain

    classifier = ClassifierSettings()
    options = RetrainOptions(
        epochs=epochs, relabel=relabel,
        min_new_labels=classifier.retrain_min_new_labels if min_new_labels is None else min_new_labels,
        triton_urls=tuple(control_urls(classifier)), family=classifier.retrain_family,
    )
    outcome = retrain(Settings().database_url, classifier, options,
                      log=lambda line: log.info("retrain", message=line))
    log.info("retrain_finished", status=outcome.status, reason=outcome.reason, record_id=outcome.record_id)
    return outcome.summary()
