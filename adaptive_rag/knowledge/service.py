"""The knowledge-base use cases: upsert, delete, sync a source, rebuild, describe, and the
abstention threshold (derived, overridden).

Each write holds the tenant's writer lock, chunks documents (`chunking`), writes the index first
and then the records, so a search never finds a chunk the records do not know about for long,
and a failed write leaves records that a retry of the same call repairs. A write that changed the
index then derives the knowledge base's own abstention threshold again (`calibration`), still
under the lock. The gRPC service (`services.frontdoor.knowledge`) and the CLI (`arag kb`) are
thin edges over this class.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from adaptive_rag.contracts import DEFAULT_TENANT_STYLE, AnswerStyle
from adaptive_rag.domain import Passage
from adaptive_rag.errors import InvalidDocumentError, InvalidRequestError, KnowledgeBaseMissingError
from adaptive_rag.knowledge.calibration import ThresholdInEffect, calibrate, threshold_in_effect
from adaptive_rag.knowledge.documents import Document, KnowledgeIndex
from adaptive_rag.settings import Settings
from adaptive_rag.storage.knowledge import DocumentRecord, KnowledgeBaseState, KnowledgeRecords

log = logging.getLogger(__name__)

MAX_DOCUMENT_ID_CHARS = 256
MAX_DOCUMENT_CHARS = 2_000_000
WRITE_BATCH = 200  # documents per index write


@dataclass(frozen=True)
class ChangeSummary:
    """What one write did to a tenant's knowledge base."""

    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    not_found: int = 0  # deletes of ids the knowledge base does not have
    chunks_written: int = 0
    chunks_removed: int = 0
    generation: int = 0

    def plus(self, other: ChangeSummary) -> ChangeSummary:
        """Both summaries added up (the later generation kept)."""
        counts = {name: getattr(self, name) + getattr(other, name) for name in (
            "added", "updated", "unchanged", "deleted", "not_found", "chunks_written", "chunks_removed")}
        return ChangeSummary(**counts, generation=max(self.generation, other.generation))


# Where a tenant's answer style comes from (`style_in_effect`).
STYLE_FROM_TENANT = "tenant"
STYLE_FROM_DEPLOYMENT = "deployment setting"


@dataclass(frozen=True)
class KnowledgeBaseInfo:
    tenant: str
    documents: int
    chunks: int
    generation: int
    updated_at: datetime | None
    backend: str
    # The relevance threshold a query abstains below, where it comes from, and how the
    # automatic one was derived (None: not derived yet).
    abstention: ThresholdInEffect
    calibration: dict[str, Any] | None = None
    # How the tenant's answers read, and whether the operator chose it for this tenant
    # ("tenant") or it is the deployment's ("deployment setting").
    answer_style: AnswerStyle = DEFAULT_TENANT_STYLE
    answer_style_source: str = STYLE_FROM_DEPLOYMENT


def style_in_effect(chosen: AnswerStyle | None, deployment: AnswerStyle) -> tuple[AnswerStyle, str]:
    """The tenant's answer style and where it comes from: its own, else the deployment's."""
    if chosen is not None:
        return chosen, STYLE_FROM_TENANT
    return deployment, STYLE_FROM_DEPLOYMENT


def check_document_id(doc_id: str) -> None:
    """A document id the service can store and address, or `InvalidDocumentError` (upserts and
    deletes alike: an id reaches the records database either way)."""
    if not doc_id or not doc_id.strip():
        raise InvalidDocumentError("a document needs a non-empty id")
    if len(doc_id) > MAX_DOCUMENT_ID_CHARS:
        raise InvalidDocumentError(f"document id {doc_id[:40]!r}... is longer than {MAX_DOCUMENT_ID_CHARS} characters")
    if "#" in doc_id:
        raise InvalidDocumentError(f"document id {doc_id!r} contains '#', which separates chunk positions")
    if any(ord(c) < 32 for c in doc_id):
        raise InvalidDocumentError(f"document id {doc_id!r} contains a control character")


def check_document(doc: Document) -> None:
    """A document the service can index, or `InvalidDocumentError` saying what is wrong. Checked
    before anything is written, so the index and the records never disagree over a refused one."""
    check_document_id(doc.id)
    if not doc.title.strip() and not doc.text.strip():
        raise InvalidDocumentError(f"document {doc.id!r} has neither title nor text")
    size = len(doc.title) + sum(len(s.heading) + len(s.text) for s in doc.sections)
    if size > MAX_DOCUMENT_CHARS:
        raise InvalidDocumentError(f"document {doc.id!r} has {size} characters; the limit is {MAX_DOCUMENT_CHARS}")
    fields = {"title": doc.title, "url": doc.url, "source": doc.source,
              **{f"section {n} heading": s.heading for n, s in enumerate(doc.sections, 1)},
              **{f"section {n} text": s.text for n, s in enumerate(doc.sections, 1)},
              **{f"metadata {k!r}": f"{k}{v}" for k, v in doc.metadata.items()}}
    for name, text in fields.items():
        if "\x00" in text:  # PostgreSQL text cannot hold U+0000; nothing a reader needs either
            raise InvalidDocumentError(f"document {doc.id!r}: its {name} contains a NUL character (U+0000)")


def chunk_ids(doc_id: str, start: int, stop: int) -> list[str]:
    return [f"{doc_id}#{position}" for position in range(start, stop)]


class KnowledgeBaseService:
    """Keeps each tenant's index and its records in step; every call is scoped to one tenant."""

    def __init__(self, index: KnowledgeIndex, records: KnowledgeRecords, *, chunk_words: int = 160,
                 overlap_words: int = 32, backend: str = "",
                 deployment_threshold: float | None = None,
                 default_style: AnswerStyle = DEFAULT_TENANT_STYLE) -> None:
        """`deployment_threshold`: ARAG_ABSTAIN_MIN_RELEVANCE (None: unset), which `describe`
        weighs when it says which threshold is in effect."""
        self.index = index
        self.records = records
        self.chunk_words = chunk_words
        self.overlap_words = overlap_words
        self.backend = backend or type(index).__name__
        self.deployment_threshold = deployment_threshold
        self.default_style = default_style  # ARAG_ANSWER_STYLE: a tenant's until it chooses its own

    # --- writes ----------------------------------------------------------------------------------

    def upsert(self, tenant: str, documents: Sequence[Document],
               on_progress: Callable[[int], None] | None = None, *, calibrate: bool = True) -> ChangeSummary:
        """Add or replace `documents` (by id); unchanged ones are skipped. `calibrate=False`
        leaves the threshold to a later `calibrate` (a stream of batches derives it once)."""
        with self.records.writer_lock(tenant):
            summary = self._apply(tenant, _unique(documents), (), on_progress)
            if calibrate:
                self._recalibrate(tenant, summary)
            return summary

    def delete(self, tenant: str, doc_ids: Iterable[str]) -> ChangeSummary:
        """Remove these documents and all their chunks."""
        with self.records.writer_lock(tenant):
            ids = list(dict.fromkeys(doc_ids))
            for doc_id in ids:
                check_document_id(doc_id)
            summary = self._apply(tenant, (), delete_ids=ids)
            self._recalibrate(tenant, summary)
            return summary

    def sync_source(self, tenant: str, source: str, documents: Sequence[Document],
                    on_progress: Callable[[int], None] | None = None) -> ChangeSummary:
        """Make the documents imported from `source` exactly `documents`: upsert them and delete
        the ones an earlier import of `source` had that are gone now."""
        documents = _unique(documents)
        with self.records.writer_lock(tenant):
            present = {d.id for d in documents}
            gone = [doc_id for doc_id in self.records.documents(tenant, source=source) if doc_id not in present]
            summary = self._apply(tenant, documents, gone, on_progress)
            self._recalibrate(tenant, summary)
            return summary

    def rebuild(self, tenant: str, documents: Sequence[Document]) -> ChangeSummary:
        """Replace the whole knowledge base with `documents`: a new index generation is built
        beside the live one and switched to atomically; searches answer throughout."""
        documents = _unique(documents)
        for doc in documents:
            check_document(doc)
        with self.records.writer_lock(tenant):
            records: list[DocumentRecord] = []
            chunks: list[Passage] = []
            for doc in documents:
                doc_chunks = self._chunks(doc)
                chunks.extend(doc_chunks)
                records.append(self._record(doc, len(doc_chunks)))
            generation = self.index.rebuild(tenant, chunks)
            self.records.save(tenant, records, replace_all=True, generation=generation)
            summary = ChangeSummary(added=len(records), chunks_written=len(chunks), generation=generation)
            self._recalibrate(tenant, summary)
            return summary

    # --- the abstention threshold ----------------------------------------------------------------

    def calibrate(self, tenant: str) -> KnowledgeBaseInfo:
        """Derive the tenant's threshold from its knowledge base now (after a stream of batches
        written with `calibrate=False`, or for a knowledge base written before thresholds were)."""
        with self.records.writer_lock(tenant):
            self._derive(tenant, self._state(tenant))
        return self.describe(tenant)

    def set_threshold(self, tenant: str, threshold: float | None) -> KnowledgeBaseInfo:
        """The operator's relevance threshold for the tenant (wins over every other; None: back
        to the automatic one)."""
        if threshold is not None and threshold < 0:
            raise InvalidRequestError(f"an abstention threshold is a relevance >= 0, not {threshold}")
        self.records.set_abstain_override(tenant, threshold)
        return self.describe(tenant)

    def set_answer_style(self, tenant: str, style: AnswerStyle | None) -> KnowledgeBaseInfo:
        """The operator's answer style for the tenant (None: back to the deployment's)."""
        if style is not None:
            try:
                style = AnswerStyle(style)
            except ValueError:
                raise InvalidRequestError(
                    f"an answer style is one of {', '.join(s.value for s in AnswerStyle)}, not {style!r}"
                ) from None
        self.records.set_answer_style(tenant, style)
        return self.describe(tenant)

    def _recalibrate(self, tenant: str, summary: ChangeSummary) -> None:
        """Derive the threshold again when the write changed the index, or when the stored one
        was derived from another size of knowledge base (or never)."""
        state = self.records.state(tenant)
        if state is None:
            return
        derived_at = (state.abstain_calibration or {}).get("chunks")
        if summary.chunks_written or summary.chunks_removed or derived_at != state.chunks:
            self._derive(tenant, state)

    def _derive(self, tenant: str, state: KnowledgeBaseState) -> None:
        """A failure here leaves the previous threshold (the write itself has succeeded): logged,
        and tried again on the next write or `calibrate`."""
        try:
            retriever = self.index.retriever(tenant) if state.chunks > 0 else None
            found = calibrate(retriever, state.chunks) if retriever is not None else None
        except Exception as exc:  # noqa: BLE001 - the documents are written; the threshold waits
            log.warning("could not derive the abstention threshold of tenant %r: %s", tenant, exc)
            return
        self.records.save_calibration(tenant, found.threshold if found else None,
                                      found.as_record() if found else None)

    def _apply(self, tenant: str, documents: Sequence[Document], delete_ids: Sequence[str],
               on_progress: Callable[[int], None] | None = None) -> ChangeSummary:
        """Documents in batches (index, then records, per batch), then the deletes."""
        for doc in documents:
            check_document(doc)
        total = ChangeSummary()
        for start in range(0, len(documents), WRITE_BATCH):
            batch = documents[start:start + WRITE_BATCH]
            total = total.plus(self._apply_batch(tenant, batch, ()))
            if on_progress:
                on_progress(len(batch))
        if delete_ids or not documents:
            total = total.plus(self._apply_batch(tenant, (), delete_ids))
        return total

    def _apply_batch(self, tenant: str, documents: Sequence[Document], delete_ids: Sequence[str]) -> ChangeSummary:
        known = self.records.documents(tenant, [d.id for d in documents] + list(delete_ids))
        # Records without an index (its directory or cluster was wiped, or another deployment's
        # index shares these records): nothing counts as unchanged, nothing is there to remove.
        index_there = self.index.exists(tenant)
        write: list[Passage] = []
        remove: list[str] = []
        saved: list[DocumentRecord] = []
        added = updated = unchanged = 0
        for doc in documents:
            sha = self._sha(doc)
            before = known.get(doc.id)
            if before is not None and before.content_sha256 == sha and index_there:
                unchanged += 1
                if before.source != doc.source:  # moved between sources: keep the new owner
                    saved.append(self._record(doc, before.chunks))
                continue
            doc_chunks = self._chunks(doc)
            write.extend(doc_chunks)
            saved.append(self._record(doc, len(doc_chunks), sha))
            if before is None:
                added += 1
            else:
                updated += 1
                remove.extend(chunk_ids(doc.id, len(doc_chunks), before.chunks))
        deleted = [doc_id for doc_id in delete_ids if doc_id in known]
        for doc_id in deleted:
            remove.extend(chunk_ids(doc_id, 0, known[doc_id].chunks))
        if not index_there:
            remove = []
        if write:
            self.index.upsert(tenant, write)
        if remove:
            self.index.delete(tenant, remove)
        if saved or deleted:
            generation = self.records.save(tenant, saved, deleted).generation
        else:  # nothing changed: a tenant without a knowledge base does not get an empty one
            state = self.records.state(tenant)
            generation = state.generation if state else 0
        return ChangeSummary(
            added=added, updated=updated, unchanged=unchanged, deleted=len(deleted),
            not_found=len(delete_ids) - len(deleted), chunks_written=len(write),
            chunks_removed=len(remove), generation=generation,
        )

    # --- reads -----------------------------------------------------------------------------------

    def describe(self, tenant: str) -> KnowledgeBaseInfo:
        state = self._state(tenant)
        in_effect = threshold_in_effect(state.abstain_threshold, state.abstain_override,
                                        self.deployment_threshold)
        style, style_source = style_in_effect(state.answer_style, self.default_style)
        return KnowledgeBaseInfo(tenant, state.documents, state.chunks, state.generation,
                                 state.updated_at, self.backend, in_effect, state.abstain_calibration,
                                 style, style_source)

    def _state(self, tenant: str) -> KnowledgeBaseState:
        state = self.records.state(tenant)
        if state is None:
            raise KnowledgeBaseMissingError(
                f"tenant {tenant!r} has no knowledge base yet; import documents first "
                "(KnowledgeBase.UpsertDocuments, or `arag kb import --tenant ...`)"
            )
        return state

    def document_ids(self, tenant: str, source: str | None = None) -> list[str]:
        return sorted(self.records.documents(tenant, source=source))

    def has_knowledge_base(self, tenant: str) -> bool:
        """True when the tenant's knowledge base has at least one chunk to retrieve from."""
        state = self.records.state(tenant)
        return state is not None and state.chunks > 0

    # --- helpers ---------------------------------------------------------------------------------

    def _chunks(self, doc: Document) -> list[Passage]:
        from adaptive_rag.knowledge.chunking import chunk_document

        return chunk_document(doc, max_words=self.chunk_words, overlap_words=self.overlap_words)

    def _sha(self, doc: Document) -> str:
        """Content hash of everything that ends up in the index (chunking settings included)."""
        payload = json.dumps(
            [doc.title, [[s.heading, s.text] for s in doc.sections], doc.url,
             self.chunk_words, self.overlap_words],
            ensure_ascii=False,
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    def _record(self, doc: Document, chunks: int, sha: str | None = None) -> DocumentRecord:
        return DocumentRecord(doc.id, doc.source, doc.title[:2000], chunks, sha or self._sha(doc))


def _unique(documents: Sequence[Document]) -> list[Document]:
    """The last document of each id wins (a batch that repeats an id updates it twice)."""
    return list({doc.id: doc for doc in documents}.values())


def open_knowledge_service(settings: Settings, engine: Engine) -> KnowledgeBaseService:
    """The service over the configured backend's per-tenant indexes and `engine`'s records."""
    from adaptive_rag.knowledge.indexes import open_knowledge_index

    return KnowledgeBaseService(
        open_knowledge_index(settings), KnowledgeRecords(engine), chunk_words=settings.chunk_words,
        overlap_words=settings.chunk_overlap_words, backend=settings.retriever,
        deployment_threshold=settings.abstain_min_relevance, default_style=settings.answer_style,
    )
