"""The SubmitFeedback use case: a verdict on an earlier request of the caller's tenant."""

from __future__ import annotations

import structlog

from adaptive_rag.contracts import Scope
from adaptive_rag.errors import RequestNotFoundError
from adaptive_rag.serving.commands import SubmitFeedback
from adaptive_rag.serving.context import CallProgress, Serving
from adaptive_rag.validation import check_feedback, check_request_id

LOG = structlog.get_logger("serving.feedback")


async def submit_feedback(serving: Serving, command: SubmitFeedback, progress: CallProgress) -> int:
    """The feedback's id; another tenant's request is not found, exactly like an unknown one."""
    tenant = (await serving.authenticate(command.api_key, progress, Scope.FEEDBACK)).tenant
    request_id = check_request_id(command.request_id)
    check_feedback(command.rating, command.correct_answer, command.comment)
    progress.bind(request_id=request_id)
    try:
        feedback_id = await serving.io(serving.records.add_feedback, request_id, tenant,
                                       command.rating, command.correct_answer, command.comment)
    except RequestNotFoundError:
        raise RequestNotFoundError(f"no request {request_id} for this API key's tenant") from None
    LOG.info("feedback", rating=command.rating, feedback_id=feedback_id)
    return feedback_id
