"""What the records know about each tenant's knowledge base: its documents, sizes and generation.

The index (OpenSearch or tantivy) holds the chunks; these rows say which chunks each document has
(`<doc_id>#0` .. `#chunks-1`) and what its content hash was, so the service can skip unchanged
documents, remove left-over chunks and the documents a source no longer has, and describe the
knowledge base without asking the index. Writers of one tenant are serialised by `writer_lock`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete, func, select, update

from adaptive_rag.contracts import AnswerStyle
from adaptive_rag.errors import KnowledgeBaseBusyError, KnowledgeBaseMissingError
from adaptive_rag.storage.db import map_database_errors
from adaptive_rag.storage.locks import advisory_lock
from adaptive_rag.storage.models import (
    KnowledgeBaseRow,
    KnowledgeDocument,
    as_utc,
    utcnow,
)


@dataclass(frozen=True, slots=True)
class DocumentRecord:
    doc_id: str
    source: str
    title: str
    chunks: int
    content_sha256: str


@dataclass(frozen=True, slots=True)
class KnowledgeBaseState:
    tenant: str
    generation: int
    documents: int
    chunks: int
    updated_at: datetime | None
    # The relevance threshold derived from the knowledge base (None: not derived yet), how it
    # was derived, and the operator's override (None: none).
    abstain_threshold: float | None = None
    abstain_calibration: dict[str, Any] | None = None
    abstain_override: float | None = None
    # The operator's answer style for the tenant (None: the deployment's).
    answer_style: AnswerStyle | None = None


class KnowledgeRecords:
    """Rows of `knowledge_bases` and `kb_documents` through one engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        map_database_errors(engine)  # a database away is `DatabaseUnavailableError`, as for the records
        self.engine = engine
        self._local_locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        if engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        self._insert = insert

    @contextmanager
    def writer_lock(self, tenant: str) -> Iterator[None]:
        """Exclusive right to change `tenant`'s knowledge base, or `KnowledgeBaseBusyError` at once.

        PostgreSQL: a session advisory lock, so every process and replica agrees; SQLite (one
        machine, embedded): a lock per process (the tantivy writer lock covers other processes).
        """
        with self._guard:
            local = self._local_locks.setdefault(tenant, threading.Lock())
        if not local.acquire(blocking=False):
            raise KnowledgeBaseBusyError(f"tenant {tenant!r}'s knowledge base is being changed; retry shortly")
        try:
            if self.engine.dialect.name != "postgresql":
                yield
                return
            busy = lambda: KnowledgeBaseBusyError(  # noqa: E731
                f"tenant {tenant!r}'s knowledge base is being changed by another process; retry shortly"
            )
            with advisory_lock(self.engine, f"arag-kb:{tenant}", busy):
                yield
        finally:
            local.release()

    def state(self, tenant: str) -> KnowledgeBaseState | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(KnowledgeBaseRow).where(KnowledgeBaseRow.tenant == tenant)).first()
        if row is None:
            return None
        return KnowledgeBaseState(tenant, row.generation, row.documents, row.chunks, as_utc(row.updated_at),
                                  row.abstain_threshold, row.abstain_calibration, row.abstain_override,
                                  AnswerStyle(row.answer_style) if row.answer_style else None)

    def save_calibration(self, tenant: str, threshold: float | None,
                         calibration: dict[str, Any] | None) -> None:
        """Store the threshold derived from the tenant's knowledge base and how it was derived
        (None: none could be derived). A tenant without a knowledge base row is left alone."""
        with self.engine.begin() as conn:
            conn.execute(update(KnowledgeBaseRow).where(KnowledgeBaseRow.tenant == tenant).values(
                abstain_threshold=threshold, abstain_calibration=calibration))

    def set_abstain_override(self, tenant: str, threshold: float | None) -> KnowledgeBaseState:
        """Set (or, with None, clear) the operator's abstention threshold for the tenant, which
        wins over every other; `KnowledgeBaseMissingError` when the tenant has no knowledge base."""
        with self.engine.begin() as conn:
            changed = conn.execute(update(KnowledgeBaseRow).where(KnowledgeBaseRow.tenant == tenant).values(
                abstain_override=threshold)).rowcount
        if not changed:
            raise KnowledgeBaseMissingError(f"tenant {tenant!r} has no knowledge base yet; import documents first")
        state = self.state(tenant)
        assert state is not None
        return state

    def set_answer_style(self, tenant: str, style: AnswerStyle | None) -> KnowledgeBaseState:
        """Set (or, with None, clear) the tenant's answer style; `KnowledgeBaseMissingError`
        when the tenant has no knowledge base."""
        with self.engine.begin() as conn:
            changed = conn.execute(update(KnowledgeBaseRow).where(KnowledgeBaseRow.tenant == tenant).values(
                answer_style=None if style is None else AnswerStyle(style).value)).rowcount
        if not changed:
            raise KnowledgeBaseMissingError(f"tenant {tenant!r} has no knowledge base yet; import documents first")
        state = self.state(tenant)
        assert state is not None
        return state

    def documents(self, tenant: str, doc_ids: Iterable[str] | None = None,
                  source: str | None = None) -> dict[str, DocumentRecord]:
        """The tenant's documents (those of `doc_ids` or `source` only, when given), by id."""
        condition = KnowledgeDocument.tenant == tenant
        if source is not None:
            condition &= KnowledgeDocument.source == source
        ids = None if doc_ids is None else list(dict.fromkeys(doc_ids))
        found: dict[str, DocumentRecord] = {}
        with self.engine.connect() as conn:
            for batch in _batches(ids) if ids is not None else [None]:
                where = condition if batch is None else condition & KnowledgeDocument.doc_id.in_(batch)
                for r in conn.execute(select(KnowledgeDocument).where(where)):
                    found[r.doc_id] = DocumentRecord(r.doc_id, r.source, r.title, r.chunks, r.content_sha256)
        return found

    def save(self, tenant: str, upserted: Sequence[DocumentRecord], deleted: Iterable[str] = (),
             *, replace_all: bool = False, generation: int | None = None) -> KnowledgeBaseState:
        """Write document rows (and drop `deleted`, or every other row with `replace_all`), then
        recount the knowledge base, in one transaction; `generation`: the index generation a
        rebuild switched to."""
        now = utcnow()
        deleted = list(deleted)
        with self.engine.begin() as conn:
            if replace_all:
                conn.execute(delete(KnowledgeDocument).where(KnowledgeDocument.tenant == tenant))
            for batch in _batches(deleted):
                conn.execute(delete(KnowledgeDocument).where(
                    KnowledgeDocument.tenant == tenant, KnowledgeDocument.doc_id.in_(batch)))
            for record in upserted:
                values = dict(tenant=tenant, doc_id=record.doc_id, source=record.source,
                              title=record.title, chunks=record.chunks,
                              content_sha256=record.content_sha256, updated_at=now)
                conn.execute(self._insert(KnowledgeDocument).values(**values).on_conflict_do_update(
                    index_elements=["tenant", "doc_id"], set_=values))
            documents, chunks = conn.execute(
                select(func.count(), func.coalesce(func.sum(KnowledgeDocument.chunks), 0))
                .where(KnowledgeDocument.tenant == tenant)
            ).one()
            conn.execute(self._insert(KnowledgeBaseRow).values(
                tenant=tenant, generation=1, documents=documents, chunks=chunks, created_at=now,
                updated_at=now,
            ).on_conflict_do_nothing(index_elements=["tenant"]))
            changes = dict(documents=documents, chunks=chunks, updated_at=now)
            if generation is not None:
                changes["generation"] = generation
            conn.execute(update(KnowledgeBaseRow).where(KnowledgeBaseRow.tenant == tenant).values(**changes))
        state = self.state(tenant)
        assert state is not None
        return state


def _batches(items: Sequence[str] | None, size: int = 500) -> Iterator[list[str]]:
    if not items:
        return
    for start in range(0, len(items), size):
        yield list(items[start:start + size])
