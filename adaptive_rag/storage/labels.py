"""Reading and writing classifier training labels."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import IntegrityError

from adaptive_rag.contracts import TIERS
from adaptive_rag.storage.db import session_factory
from adaptive_rag.storage.models import TrainingLabel


class LabelStore:
    """The `training_labels` table behind a small API (the labelling job, the trainer)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = session_factory(engine)

    def existing_keys(self, origin: str = "benchmark") -> set[tuple[str, str]]:
        """`(dataset, question_id)` of every label of `origin` already stored."""
        with self._sessions() as session:
            rows = session.execute(
                select(TrainingLabel.dataset, TrainingLabel.question_id).where(
                    TrainingLabel.origin == origin
                )
            )
            return {(dataset, qid) for dataset, qid in rows}

    def add(self, label: TrainingLabel) -> bool:
        """Insert one label; False when `(origin, dataset, question_id)` is already there."""
        with self._sessions() as session:
            session.add(label)
            try:
                session.commit()
            except IntegrityError:
                session.rollback()
                return False
        return True

    def labels(
        self, split: str | None = "train", origin: str | None = None,
        datasets: Sequence[str] | None = None,
    ) -> list[TrainingLabel]:
        """Labels in a stable order (dataset, question id), optionally filtered."""
        query = select(TrainingLabel)
        if split is not None:
            query = query.where(TrainingLabel.split == split)
        if origin is not None:
            query = query.where(TrainingLabel.origin == origin)
        if datasets:
            query = query.where(TrainingLabel.dataset.in_(list(datasets)))
        query = query.order_by(TrainingLabel.dataset, TrainingLabel.question_id)
        with self._sessions() as session:
            return list(session.scalars(query))

    def counts(self) -> dict[tuple[str, str, str], int]:
        """`{(dataset, label, label_source): n}`."""
        with self._sessions() as session:
            rows = session.execute(
                select(
                    TrainingLabel.dataset, TrainingLabel.label, TrainingLabel.label_source,
                    func.count(),
                ).group_by(TrainingLabel.dataset, TrainingLabel.label, TrainingLabel.label_source)
            )
            return {(d, l, s): n for d, l, s, n in rows}


def label_counts(labels: Iterable[TrainingLabel]) -> dict[str, int]:
    counter = Counter(label.label for label in labels)
    return {tier.value: counter.get(tier.value, 0) for tier in TIERS}


# The committed label file (one JSON object per line): what reproduces a shipped router from the
# repository alone. Only what training reads is kept; the labeller's details stay in the database.
LABEL_FILE_FIELDS = ("origin", "dataset", "question_id", "question", "label", "label_source", "split",
                     "correct_metric", "outcomes")


def write_label_file(rows: Iterable[TrainingLabel], path: Path) -> int:
    """Write `rows` as JSONL in a stable order (dataset, question id); returns how many."""
    ordered = sorted(rows, key=lambda r: (r.origin, r.dataset, r.question_id))
    Path(path).write_text("".join(
        json.dumps({name: getattr(row, name) for name in LABEL_FILE_FIELDS}, sort_keys=True) + "\n"
        for row in ordered), encoding="utf-8")
    return len(ordered)


def read_label_file(path: Path) -> list[TrainingLabel]:
    """The labels of a file written by `write_label_file` (unsaved rows, never added to a session)."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            rows.append(TrainingLabel(**{name: data[name] for name in LABEL_FILE_FIELDS}))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a label row ({exc})") from None
    return rows
