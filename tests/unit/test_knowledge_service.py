"""The knowledge-base use cases over an in-memory index and SQLite records: in-place updates,
left-over chunks, sources kept in sync, rebuilds, and records that outlived their index."""

from __future__ import annotations

import pytest
from frontdoor_fakes import FakeKnowledgeIndex
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from adaptive_rag.errors import InvalidRequestError, KnowledgeBaseMissingError
from adaptive_rag.knowledge.documents import Document, Section
from adaptive_rag.knowledge.service import KnowledgeBaseService
from adaptive_rag.storage import Base, KnowledgeRecords


def doc(doc_id: str, words: int, source: str = "help.jsonl", word: str = "lamp") -> Document:
    return Document(doc_id, f"Title {doc_id}", (Section("", " ".join([word] * words) + "."),), source=source)


@pytest.fixture
def service() -> KnowledgeBaseService:
    engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    Base.metadata.create_all(engine)
    return KnowledgeBaseService(FakeKnowledgeIndex(), KnowledgeRecords(engine), chunk_words=20,
                                overlap_words=5, backend="fake")


def chunk_ids(service: KnowledgeBaseService, tenant: str = "acme") -> set[str]:
    return set(service.index.chunks.get(tenant, {}))


def test_an_update_rewrites_its_chunks_in_place_and_removes_the_left_over_ones(service):
    first = service.upsert("acme", [doc("a", 50), doc("b", 5)])
    assert (first.added, first.chunks_written) == (2, len(chunk_ids(service)))
    assert {"a#0", "a#1", "a#2", "b#0"} <= chunk_ids(service)
    same = service.upsert("acme", [doc("a", 50), doc("b", 5)])
    assert (same.unchanged, same.chunks_written, same.chunks_removed) == (2, 0, 0)
    shorter = service.upsert("acme", [doc("a", 10)])
    assert (shorter.updated, shorter.chunks_written) == (1, 1)
    assert chunk_ids(service) == {"a#0", "b#0"} and shorter.chunks_removed >= 2
    info = service.describe("acme")
    assert (info.documents, info.chunks, info.generation) == (2, 2, 1)


def test_a_source_imported_again_loses_the_documents_it_no_longer_has(service):
    service.sync_source("acme", "help.jsonl", [doc("a", 5), doc("b", 5)])
    service.upsert("acme", [doc("c", 5, source="api")])
    summary = service.sync_source("acme", "help.jsonl", [doc("a", 5)])
    assert (summary.unchanged, summary.deleted) == (1, 1)
    assert chunk_ids(service) == {"a#0", "c#0"}  # another source's document stays


def test_records_that_outlived_their_index_are_indexed_again(service):
    service.upsert("acme", [doc("a", 5)])
    service.index.chunks.clear()  # the index directory (or cluster) was wiped; the records were not
    again = service.upsert("acme", [doc("a", 5)])
    assert (again.unchanged, again.updated, again.chunks_written) == (0, 1, 1)
    assert chunk_ids(service) == {"a#0"}


def test_a_rebuild_replaces_everything_under_the_next_generation(service):
    service.upsert("acme", [doc("a", 5), doc("b", 5)])
    rebuilt = service.rebuild("acme", [doc("x", 5)])
    assert rebuilt.generation == 2 and chunk_ids(service) == {"x#0"}
    assert service.document_ids("acme") == ["x"] and service.describe("acme").generation == 2


def test_tenants_never_share_documents(service):
    service.upsert("acme", [doc("a", 5)])
    gone = service.delete("globex", ["a"])
    assert (gone.deleted, gone.not_found) == (0, 1) and chunk_ids(service) == {"a#0"}
    assert service.has_knowledge_base("acme") and not service.has_knowledge_base("globex")
    with pytest.raises(KnowledgeBaseMissingError, match="'globex' has no knowledge base"):
        service.describe("globex")


@pytest.mark.parametrize("bad, message", [
    (Document("", "T", (Section("", "t"),)), "non-empty id"),
    (Document("a#1", "T", (Section("", "t"),)), "contains '#'"),
    (Document("a\nb", "T", (Section("", "t"),)), "control character"),
    (Document("a", " ", ()), "neither title nor text"),
])
def test_a_bad_document_fails_the_whole_batch_before_anything_is_written(service, bad, message):
    with pytest.raises(InvalidRequestError, match=message):
        service.upsert("acme", [doc("good", 5), bad])
    assert chunk_ids(service) == set() and not service.has_knowledge_base("acme")


def test_nul_anywhere_in_a_document_or_a_delete_id_is_refused_before_anything_is_written(service):
    """PostgreSQL text cannot hold U+0000: refused up front, so the index and the records agree."""
    service.upsert("acme", [doc("ok", 5)])
    before = chunk_ids(service)
    bad_title = Document("t", "title\x00", (Section("", "text"),))
    bad_text = Document("s", "title", (Section("", "te\x00xt"),))
    for bad in (bad_title, bad_text):
        with pytest.raises(InvalidRequestError, match="NUL character"):
            service.upsert("acme", [bad])
    with pytest.raises(InvalidRequestError, match="control character"):
        service.delete("acme", ["ok\x00"])
    assert chunk_ids(service) == before
