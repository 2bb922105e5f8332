"""The record of classifier versions: promotion verdicts, retrain runs, rollbacks (`model_promotions`),
and the lock that keeps two retraining or publishing jobs from running at once."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from adaptive_rag.errors import AdaptiveRagError
from adaptive_rag.storage.db import session_factory
from adaptive_rag.storage.locks import advisory_lock
from adaptive_rag.storage.models import ModelPromotion, TrainingLabel, as_utc

ACTIONS = ("promote", "retrain", "rollback")
VERDICTS = ("promoted", "refused", "failed", "skipped", "rolled_back")


class JobBusyError(AdaptiveRagError):
    """Another process holds the job's lock (a retrain or a promotion is running)."""


@dataclass(frozen=True, slots=True)
class PromotionRecord:
    id: int
    model_name: str
    action: str
    verdict: str
    challenger_run: str | None
    challenger_version: int | None
    champion_version: int | None
    served_version: int | None
    metric: str | None
    challenger_score: float | None
    champion_score: float | None
    validation_counts: dict[str, int] | None
    new_labels: int | None
    label_watermark: int | None
    reason: str
    details: dict[str, Any] | None
    created_at: datetime | None

    def summary(self) -> dict[str, Any]:
        """The row as JSON-ready data (what `arag model history` prints)."""
        data = {k: getattr(self, k) for k in self.__slots__ if k != "details"}
        data["created_at"] = self.created_at.isoformat() if self.created_at else None
        return data


def _record(row: ModelPromotion) -> PromotionRecord:
    return PromotionRecord(
        id=row.id, model_name=row.model_name, action=row.action, verdict=row.verdict,
        challenger_run=row.challenger_run, challenger_version=row.challenger_version,
        champion_version=row.champion_version, served_version=row.served_version, metric=row.metric,
        challenger_score=row.challenger_score, champion_score=row.champion_score,
        validation_counts=row.validation_counts, new_labels=row.new_labels,
        label_watermark=row.label_watermark, reason=row.reason or "", details=row.details,
        created_at=as_utc(row.created_at),
    )


class PromotionStore:
    """`model_promotions` behind a small API: record a decision, read the recent ones, count the
    labels that arrived since the last retrain."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = session_factory(engine)

    def record(self, model_name: str, action: str, verdict: str, **fields: Any) -> PromotionRecord:
        """Insert one decision (fields: the `ModelPromotion` columns) and return it."""
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, not {action!r}")
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {verdict!r}")
        with self._sessions() as session:
            row = ModelPromotion(model_name=model_name, action=action, verdict=verdict, **fields)
            session.add(row)
            session.commit()
            return _record(row)

    def add_details(self, record_id: int, extra: dict[str, Any]) -> PromotionRecord:
        """Merge `extra` into a recorded decision's `details` (a step that runs after the verdict)."""
        with self._sessions() as session:
            row = session.get(ModelPromotion, record_id)
            if row is None:
                raise KeyError(f"no model_promotions row {record_id}")
            row.details = {**(row.details or {}), **extra}
            session.commit()
            return _record(row)

    def recent(self, model_name: str, limit: int = 20) -> list[PromotionRecord]:
        """The latest decisions about `model_name`, newest first."""
        with self._sessions() as session:
            rows = session.scalars(
                select(ModelPromotion).where(ModelPromotion.model_name == model_name)
                .order_by(ModelPromotion.id.desc()).limit(limit)
            )
            return [_record(row) for row in rows]

    def last_decided_retrain(self, model_name: str) -> PromotionRecord | None:
        """The last retrain that reached a verdict on its labels (promoted or refused): new
        labels are counted from its watermark. Failed and skipped runs do not move it, so the
        next run tries again."""
        with self._sessions() as session:
            row = session.scalars(
                select(ModelPromotion).where(
                    ModelPromotion.model_name == model_name, ModelPromotion.action == "retrain",
                    ModelPromotion.verdict.in_(("promoted", "refused")),
                    ModelPromotion.label_watermark.is_not(None),
                ).order_by(ModelPromotion.id.desc()).limit(1)
            ).first()
            return _record(row) if row is not None else None

    def label_watermark(self) -> int:
        """The highest `training_labels.id` now (0 when there are none)."""
        with self._sessions() as session:
            return int(session.scalar(select(func.max(TrainingLabel.id))) or 0)

    def new_train_labels(self, model_name: str) -> tuple[int, int]:
        """`(new, watermark)`: `train` labels added since the last decided retrain of
        `model_name` (all of them before the first), and the watermark to record now."""
        last = self.last_decided_retrain(model_name)
        since = last.label_watermark if last is not None and last.label_watermark is not None else 0
        with self._sessions() as session:
            new = session.scalar(
                select(func.count()).select_from(TrainingLabel)
                .where(TrainingLabel.split == "train", TrainingLabel.id > since)
            )
            watermark = session.scalar(select(func.max(TrainingLabel.id)))
        return int(new or 0), int(watermark or 0)


@contextmanager
def job_lock(engine: Engine, name: str, lock_file: Path, wait_s: float = 0.0) -> Iterator[None]:
    """Exclusive right to run job `name` (e.g. `retrain:complexity`), or `JobBusyError`.

    PostgreSQL: a session advisory lock, so every process, container and pod agrees (a crashed
    holder's session ends and frees it). Other databases (SQLite: one machine): an `flock` on
    `lock_file`, which the kernel frees when the holder dies. `wait_s` > 0 waits that long for
    the holder to finish before giving up.
    """
    if engine.dialect.name == "postgresql":
        busy = lambda: JobBusyError(f"{name} is already running in another process")  # noqa: E731
        with advisory_lock(engine, f"arag-job:{name}", busy, wait_s):
            yield
        return
    deadline = time.monotonic() + wait_s
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:  # one open file description per holder: threads conflict too
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise JobBusyError(f"{name} is already running (lock {lock_file})") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
