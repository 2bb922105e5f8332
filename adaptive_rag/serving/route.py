"""The Route use case: classify a query and record the decision; nothing is enqueued (the client
runs the strategy itself and may send feedback on the decision's id)."""

from __future__ import annotations

import uuid

from adaptive_rag.contracts import RequestStatus, Scope
from adaptive_rag.serving.commands import Route, Routed
from adaptive_rag.serving.context import CallProgress, Serving
from adaptive_rag.validation import decode_query


async def route(serving: Serving, command: Route, progress: CallProgress) -> Routed:
    tenant = (await serving.authenticate(command.api_key, progress, Scope.ANSWER)).tenant
    query = decode_query(command.raw_query, serving.config.max_query_chars)
    request_id = uuid.uuid4().hex
    progress.bind(request_id=request_id)
    decision = await serving.classify(query, tenant, progress)
    with progress.stage("record"):
        await serving.io(serving.records.create_request, request_id, tenant, None, query,
                         RequestStatus.ROUTED, decision)
    serving.routed(decision)
    return Routed(request_id, decision)
