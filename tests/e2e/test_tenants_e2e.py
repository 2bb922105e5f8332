"""Tenants on the real stack, through gRPC, on both retrieval backends (embedded tantivy and a real
OpenSearch): each tenant brings its knowledge base through the KnowledgeBase API, which derives its
own abstention threshold, and a question the knowledge base does not cover is answered
`answerable = false` with the closest sources; retrieval never crosses tenants, even for a query
quoting another tenant's text word for word; no tenant reads, rates or deletes another's requests
or documents; a key without the write scope changes nothing; a full rebuild swaps the index while
queries keep being answered (zero errors).

The lab's stack (`lab.harness.stack`): real Redis, PostgreSQL, Triton (the length router), Celery
worker pools with the embedded model, the front door as its own process; OpenSearch from the root
conftest.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest
from e2e_stack import E2E_SETTINGS, REPO, Stack, client_of

from adaptive_rag.contracts import Scope
from adaptive_rag.knowledge.calibration import FLOOR
from adaptive_rag.knowledge.documents import Document, Section
from adaptive_rag.knowledge.importers import import_path
from adaptive_rag.knowledge.service import open_knowledge_service
from adaptive_rag.strategies.abstention import NO_PASSAGE
from lab.harness.stack import TIER_POOLS, Parts, lab_stack
from services.frontdoor.knowledge import upload_documents
from services.frontdoor.stubs import pb2, pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.model]

# Globex's secret: a sentence no other tenant has. The query quoting it is long (tier C: the
# multi-step strategy retrieves several times) and a medium one goes to B (the length router).
SECRET = "The Globex orbital toaster ships with a titanium heat shield rated for re-entry."
SECRET_DOC = Document("orbital-toaster", "Globex orbital toaster",
                      (Section("Shipping", SECRET),), source="api")
QUOTE = f'What does this mean: "{SECRET}"'
SHORT = "What kind of heat shield does the Globex orbital toaster ship with?"  # tier B


class Tenants:
    """The stack plus one reader and one writer key per tenant."""

    def __init__(self, stack: Stack, keys: dict[str, str]) -> None:
        self.stack = stack
        self.keys = keys
        self.kb = pb2_grpc.KnowledgeBaseStub(stack.channel)

    def auth(self, name: str):
        return (("authorization", f"Bearer {self.keys[name]}"),)

    def answer(self, name: str, query: str, **fields) -> pb2.AnswerReply:
        return self.stack.answer(query, auth=self.auth(name), **fields)[0]


@pytest.fixture(scope="module", params=["tantivy", "opensearch"])
def tenants(request, redis_url, postgres_url, model_repository, tmp_path_factory) -> Iterator[Tenants]:
    backend = request.param
    settings = {**E2E_SETTINGS, "redis_url": redis_url, "database_url": postgres_url}
    if backend == "opensearch":
        settings.update(opensearch_url=request.getfixturevalue("opensearch_url"),
                        kb_index_prefix=f"e2e-{uuid.uuid4().hex[:8]}")
    parts = Parts(broker="redis", records="postgres", classifier="triton", retriever=backend, llm="embedded")
    with lab_stack(tmp_path_factory.mktemp(f"tenants-{backend}"), parts, pools=TIER_POOLS, settings=settings,
                   model_repository=model_repository, tenants=(), dotenv=False) as lab:
        run = uuid.uuid4().hex[:6]
        names = {"acme": f"acme-{run}", "globex": f"globex-{run}"}
        keys = {}
        for short, tenant in names.items():
            keys[short] = lab.api_key(tenant)
            keys[f"{short}-writer"] = lab.api_key(tenant, frozenset({Scope.KB_WRITE}))
        built = client_of(lab, keys["acme"])
        try:
            built.extra["tenants"] = names
            yield Tenants(built, keys)
        finally:
            built.channel.close()


@pytest.fixture(scope="module")
def filled(tenants: Tenants) -> Tenants:
    """acme: the demo help centre; globex: the help centre too, plus its secret document."""
    help_centre = import_path(REPO / "demo" / "knowledge_base.jsonl")
    channel = tenants.stack.channel
    acme = upload_documents(channel, tenants.keys["acme-writer"], help_centre)
    globex = upload_documents(channel, tenants.keys["globex-writer"], [*help_centre, SECRET_DOC])
    assert acme.added == len(help_centre) and globex.added == len(help_centre) + 1
    return tenants


def test_a_tenant_without_a_knowledge_base_gets_failed_precondition(tenants: Tenants) -> None:
    newcomer = tenants.stack.store.create_api_key(f"newcomer-{uuid.uuid4().hex[:6]}")
    with pytest.raises(grpc.RpcError) as info:
        tenants.stack.answer("How long is the warranty?", auth=(("authorization", f"Bearer {newcomer}"),))
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "has no knowledge base yet" in info.value.details()


def test_an_imported_knowledge_base_gets_its_own_threshold_and_abstains_on_what_it_does_not_cover(
    filled: Tenants,
) -> None:
    info = filled.kb.DescribeKnowledgeBase(pb2.DescribeKnowledgeBaseRequest(), metadata=filled.auth("acme"))
    assert info.abstain_threshold_source == "automatic" and info.HasField("automatic_abstain_threshold")
    assert info.abstain_threshold == info.automatic_abstain_threshold >= FLOOR
    # shares only common words with the help centre: the closest passages go to the human agent
    uncovered = filled.answer("acme", "How do I remove a red wine stain from a carpet?")
    assert uncovered.tier in (pb2.TIER_B, pb2.TIER_C) and not uncovered.answerable and uncovered.answer == ""
    assert "does not cover the question" in uncovered.unanswerable_reason and uncovered.sources
    # shares no word with it at all: nothing retrieved, whatever the threshold
    nothing = filled.answer("acme", "Who won the football world cup in 2018?")
    assert (nothing.answerable, nothing.unanswerable_reason, list(nothing.sources)) == (False, NO_PASSAGE, [])
    covered = filled.answer("acme", "How long is the Lumora Hub H2 warranty?")
    assert covered.tier == pb2.TIER_B and covered.answerable and covered.answer.strip()


def test_retrieval_never_crosses_tenants_even_for_a_word_for_word_quote(filled: Tenants) -> None:
    for query in (QUOTE, SHORT):
        globex = filled.answer("globex", query)
        assert "orbital-toaster#0" in {s.id for s in globex.sources}, (query, globex)
        acme = filled.answer("acme", query)
        assert acme.tier in (pb2.TIER_B, pb2.TIER_C) and acme.sources  # it did retrieve
        assert not any(s.id.startswith("orbital-toaster") for s in acme.sources), acme
        assert "titanium" not in " ".join(s.title for s in acme.sources).lower()


def test_no_tenant_reads_rates_or_deletes_another_tenants_requests_or_documents(filled: Tenants) -> None:
    globex_reply = filled.answer("globex", SHORT)
    acme = filled.auth("acme")
    for call, request in (
        (filled.stack.stub.GetResult, pb2.GetResultRequest(request_id=globex_reply.request_id)),
        (filled.stack.stub.SubmitFeedback, pb2.FeedbackRequest(request_id=globex_reply.request_id, rating=-1)),
    ):
        with pytest.raises(grpc.RpcError) as info:
            call(request, metadata=acme, timeout=30)
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
    gone = filled.kb.DeleteDocuments(pb2.DeleteDocumentsRequest(document_ids=["orbital-toaster"]),
                                     metadata=filled.auth("acme-writer"), timeout=60)
    assert (gone.deleted, gone.not_found) == (0, 1)
    for key in ("acme", "globex"):  # readers may not write, not even their own knowledge base
        with pytest.raises(grpc.RpcError) as info:
            filled.kb.DeleteDocuments(pb2.DeleteDocumentsRequest(document_ids=["orbital-toaster"]),
                                      metadata=filled.auth(key), timeout=60)
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "orbital-toaster#0" in {s.id for s in filled.answer("globex", SHORT).sources}
    info = filled.kb.DescribeKnowledgeBase(pb2.DescribeKnowledgeBaseRequest(), metadata=filled.auth("acme"))
    assert info.documents == len(import_path(REPO / "demo" / "knowledge_base.jsonl"))


def test_an_update_is_answered_at_once_and_a_rebuild_swaps_without_a_failed_query(filled: Tenants) -> None:
    writer = filled.auth("globex-writer")
    updated = Document(SECRET_DOC.id, SECRET_DOC.title,
                       (Section("Shipping", SECRET.replace("titanium", "ceramic")),), source="api")
    reply = filled.kb.UpsertDocuments(pb2.UpsertDocumentsRequest(documents=[
        pb2.Document(id=updated.id, title=updated.title,
                     sections=[pb2.Section(heading=s.heading, text=s.text) for s in updated.sections])]),
        metadata=writer, timeout=60)
    assert reply.updated == 1
    # Queries answered from globex's knowledge base in a loop while a rebuild replaces it.
    errors: list[str] = []
    answered: list[pb2.AnswerReply] = []
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            try:
                answered.append(filled.answer("globex", SHORT))
            except grpc.RpcError as exc:
                errors.append(f"{exc.code().name}: {exc.details()}")

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        time.sleep(2.0)
        settings = filled.stack.settings.library
        service = open_knowledge_service(settings, filled.stack.store.engine)
        tenant = filled.stack.extra["tenants"]["globex"]
        before = service.describe(tenant).generation
        filler = [Document(f"filler-{i}", f"Archived notice {i}", (Section("", f"Notice {i} about store hours."),))
                  for i in range(3000)]  # a rebuild that takes a while
        rebuilt = service.rebuild(tenant, [*import_path(REPO / "demo" / "knowledge_base.jsonl"), updated, *filler])
        assert rebuilt.generation == before + 1
        time.sleep(2.0)
    finally:
        stop.set()
        asker.join(300)
    assert errors == [] and len(answered) >= 2
    assert all("orbital-toaster#0" in {s.id for s in a.sources} for a in answered)
    info = filled.kb.DescribeKnowledgeBase(pb2.DescribeKnowledgeBaseRequest(), metadata=filled.auth("globex"))
    assert info.generation == before + 1
