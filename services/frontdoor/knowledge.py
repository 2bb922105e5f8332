"""The `KnowledgeBase` gRPC service: the gRPC edge of `adaptive_rag.knowledge.service`.

The tenant comes from the API key; writes need the `kb:write` scope, Describe any key of the
tenant. Calls run through the front door's `run_call`, so they share its status table, metrics
and logs; the knowledge-base work itself blocks (index + records) and runs off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from adaptive_rag.contracts import CallError, Scope
from adaptive_rag.errors import InvalidRequestError
from adaptive_rag.knowledge.documents import Document, Section
from adaptive_rag.knowledge.service import ChangeSummary, KnowledgeBaseService
from adaptive_rag.serving.context import CallProgress

from services.frontdoor.auth import bearer_token
from services.frontdoor.stubs import pb2, pb2_grpc

if TYPE_CHECKING:
    from services.frontdoor.server import FrontDoor

MAX_BATCH_DOCUMENTS = 500
STREAM_BATCH_DOCUMENTS = 100
API_SOURCE = "api"
T = TypeVar("T")


def document_from_message(message: Any) -> Document:
    """A `Document` from its protobuf form (`sections` win over `text`)."""
    if message.sections:
        sections = tuple(Section(s.heading, s.text) for s in message.sections)
    else:
        sections = (Section("", message.text),) if message.text else ()
    return Document(id=message.id, title=message.title, sections=sections, url=message.url,
                    source=API_SOURCE, metadata=dict(message.metadata))


def document_message(doc: Document) -> pb2.Document:
    """The protobuf form of `doc` (what a client sends; `document_from_message` reads it back)."""
    return pb2.Document(
        id=doc.id, title=doc.title, url=doc.url, metadata=dict(doc.metadata),
        sections=[pb2.Section(heading=s.heading, text=s.text) for s in doc.sections],
    )


def upload_documents(channel: grpc.Channel, api_key: str, documents: Iterable[Document],
                     timeout_s: float = 300.0) -> pb2.ChangeReply:
    """Stream `documents` into the key's tenant's knowledge base (the client side, for the demo,
    load tests and end-to-end tests; the key needs the `kb:write` scope)."""
    stub = pb2_grpc.KnowledgeBaseStub(channel)
    return stub.StreamDocuments((document_message(d) for d in documents), timeout=timeout_s,
                                metadata=(("authorization", f"Bearer {api_key}"),))


def change_reply(summary: ChangeSummary) -> pb2.ChangeReply:
    return pb2.ChangeReply(
        added=summary.added, updated=summary.updated, unchanged=summary.unchanged,
        deleted=summary.deleted, not_found=summary.not_found,
        chunks_written=summary.chunks_written, chunks_removed=summary.chunks_removed,
        generation=summary.generation,
    )


class KnowledgeBaseServicer(pb2_grpc.KnowledgeBaseServicer):
    def __init__(self, front: FrontDoor, knowledge: KnowledgeBaseService) -> None:
        self.front = front
        self.knowledge = knowledge

    async def _tenant(self, context: grpc.aio.ServicerContext, progress: CallProgress,
                      scope: Scope | None) -> str:
        principal = await self.front.service.authenticate(
            bearer_token(context.invocation_metadata()), progress, scope)
        return principal.tenant

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def UpsertDocuments(self, request, context):  # noqa: N802 - gRPC method name
        async def body(progress: CallProgress) -> pb2.ChangeReply:
            tenant = await self._tenant(context, progress, Scope.KB_WRITE)
            if len(request.documents) > MAX_BATCH_DOCUMENTS:
                raise InvalidRequestError(
                    f"{len(request.documents)} documents in one call; send at most "
                    f"{MAX_BATCH_DOCUMENTS} per UpsertDocuments, or use StreamDocuments",
                    reason=CallError.TOO_MANY_DOCUMENTS,
                )
            documents = [document_from_message(m) for m in request.documents]
            with progress.stage("knowledge"):
                summary = await self._blocking(self.knowledge.upsert, tenant, documents)
            return change_reply(summary)

        return await self.front.run_call("UpsertDocuments", context, body)

    async def StreamDocuments(self, request_iterator: AsyncIterator[Any], context):  # noqa: N802
        async def body(progress: CallProgress) -> pb2.ChangeReply:
            tenant = await self._tenant(context, progress, Scope.KB_WRITE)
            total = ChangeSummary()
            batch: list[Document] = []
            async for message in request_iterator:
                batch.append(document_from_message(message))
                if len(batch) >= STREAM_BATCH_DOCUMENTS:
                    total = total.plus(await self._blocking(self._upsert_uncalibrated, tenant, batch))
                    batch = []
            if batch:
                total = total.plus(await self._blocking(self._upsert_uncalibrated, tenant, batch))
            if total.chunks_written or total.chunks_removed:  # the threshold, once for the stream
                await self._blocking(self.knowledge.calibrate, tenant)
            return change_reply(total)

        return await self.front.run_call("StreamDocuments", context, body)

    def _upsert_uncalibrated(self, tenant: str, documents: list[Document]) -> ChangeSummary:
        return self.knowledge.upsert(tenant, documents, calibrate=False)

    async def DeleteDocuments(self, request, context):  # noqa: N802
        async def body(progress: CallProgress) -> pb2.ChangeReply:
            tenant = await self._tenant(context, progress, Scope.KB_WRITE)
            ids: Iterable[str] = list(request.document_ids)
            summary = await self._blocking(self.knowledge.delete, tenant, ids)
            return change_reply(summary)

        return await self.front.run_call("DeleteDocuments", context, body)

    async def DescribeKnowledgeBase(self, request, context):  # noqa: N802
        async def body(progress: CallProgress) -> pb2.KnowledgeBaseInfo:
            tenant = await self._tenant(context, progress, None)
            info = await self._blocking(self.knowledge.describe, tenant)
            return pb2.KnowledgeBaseInfo(
                documents=info.documents, chunks=info.chunks, generation=info.generation,
                updated_at=info.updated_at.isoformat() if info.updated_at else "",
                backend=info.backend, abstain_threshold=info.abstention.value,
                abstain_threshold_source=info.abstention.source.value,
                automatic_abstain_threshold=info.abstention.automatic,
                answer_style=info.answer_style.value, answer_style_source=info.answer_style_source,
            )

        return await self.front.run_call("DescribeKnowledgeBase", context, body)
