"""The GetResult use case: an earlier Answer's stored reply, or why there is none yet.

Also what a reply is made of wherever it is read (here, and a replayed Answer): the stored result,
or the worker's recorded error raised as `AnswerFailedError`.
"""

from __future__ import annotations

from adaptive_rag.contracts import (
    FINISHED, NEVER_RAN, RETRYABLE_ERRORS, AnswerResult, CallError, RequestStatus, Scope,
)
from adaptive_rag.errors import AnswerFailedError, RequestNotFinishedError, RequestNotFoundError
from adaptive_rag.serving.commands import Answered, GetResult
from adaptive_rag.serving.context import CallProgress, Serving
from adaptive_rag.validation import check_request_id


async def get_result(serving: Serving, command: GetResult, progress: CallProgress) -> Answered:
    tenant = (await serving.authenticate(command.api_key, progress, Scope.ANSWER)).tenant
    request_id = check_request_id(command.request_id)
    view = await serving.io(serving.records.get_request, request_id)
    if view is None or view.tenant != tenant:
        raise RequestNotFoundError(f"no request {request_id} for this API key's tenant")
    progress.bind(request_id=request_id)
    decision = await serving.io(serving.records.decision_for, request_id)
    if decision is not None:
        progress.tier = decision.tier
    if view.status in FINISHED and decision is not None:
        return Answered.stored(request_id, decision, await stored_result(serving, request_id), view)
    if view.status is RequestStatus.ROUTED:
        raise RequestNotFinishedError(
            f"request {request_id} is a routing decision only (Route): nothing ran here",
            reason=CallError.ROUTE_ONLY,
        )
    if view.status in NEVER_RAN:
        raise RequestNotFinishedError(
            f"request {request_id} was {view.status.value} and never ran; send the Answer again "
            "(with the same client_request_id to keep this request id)", reason=CallError.NEVER_RAN,
        )
    raise RequestNotFinishedError(
        f"request {request_id} is still {view.status.value}; call GetResult again later"
    )


async def stored_result(serving: Serving, request_id: str) -> AnswerResult:
    """A finished request's result (its recorded error raised, `answer_or_raise`)."""
    stored = await serving.io(serving.records.get_result, request_id)
    if stored is None:
        raise RuntimeError(f"request {request_id} is finished but has no result row")
    return answer_or_raise(request_id, stored)


def answer_or_raise(request_id: str, result: AnswerResult) -> AnswerResult:
    if result.error_code is not None:
        # Said before the detail, which may be long (a status message is clipped at its end).
        again = (" (send the Answer again with the same client_request_id to run it again)"
                 if result.error_code in RETRYABLE_ERRORS else "")
        raise AnswerFailedError(
            f"request {request_id} failed in the worker{again}: {result.error or result.error_code.value}",
            result.error_code,
        )
    return result
